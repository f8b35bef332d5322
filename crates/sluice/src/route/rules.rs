//! Query rules, compiled once from `[[rules]]`: which rule a statement falls under, and what it
//! says to do. The first rule whose conditions all hold applies.
//!
//! Matching stays cheap with many rules: a regular expression is tried on a digest's
//! normalized text once per worker, and the outcome for every rule is kept with the digest (a
//! bit per rule); a statement then costs its digest, one lookup, and a walk over the rules whose
//! bit is set. A `/* sluice: route=... */` comment in the statement overrides any rule's route.

use std::net::IpAddr;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use regex::bytes::Regex;
use rustc_hash::FxHashMap;

use crate::config::{BackendConfig, Network, RuleConfig, parse_digest};

/// Where a rule (or a comment) sends a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteTo {
    Primary,
    Replica,
    /// Backends by index (bits, for the first 64 backends): one named, or a group.
    Among(u64),
}

/// What a rule does to the statements it matches.
#[derive(Debug)]
pub struct Action {
    pub route: Option<RouteTo>,
    /// The error code and message a blocked statement gets.
    pub block: Option<(u16, String)>,
    pub rewrite: Option<(Regex, String)>,
    /// The backend (by index) that receives a copy.
    pub mirror: Option<usize>,
    pub timeout: Option<Duration>,
    pub cache_ttl: Option<Duration>,
}

#[derive(Debug)]
pub struct Rule {
    pub name: String,
    user: Option<String>,
    schema: Option<String>,
    client: Option<Network>,
    digest: Option<u64>,
    pub action: Action,
    pub hits: Counter,
    /// Statements killed for running over the rule's timeout.
    pub timeouts: Counter,
}

/// Who runs a statement, for the rules' conditions.
pub struct Who<'a> {
    pub user: &'a str,
    pub schema: Option<&'a str>,
    pub client: Option<IpAddr>,
    /// How its statement's text is read (its session's `sql_mode`): patterns match the text
    /// normalized in that reading.
    pub mode: sluice_proto::lexer::Mode,
}

/// Per worker: which patterns each digest's normalized text matches (bits by pattern).
type Matches = FxHashMap<u64, Box<[u64]>>;

/// Digests remembered per worker before the memory of matches starts again.
const MATCHES_KEPT: usize = 20_000;

pub struct Rules {
    pub list: Vec<Rule>,
    patterns: Vec<Regex>,
    /// The rule of each pattern, and the rules that have none.
    pattern_rule: Vec<usize>,
    unpatterned: Vec<usize>,
    matches: Box<[Mutex<Matches>]>,
    backends: Vec<(String, Option<String>)>,
}

impl Rules {
    /// Compiles the rules (checked already when the configuration was read).
    pub fn new(
        rules: &[RuleConfig],
        backends: &[BackendConfig],
        shards: usize,
        metrics: &crate::metrics::Metrics,
    ) -> Result<Rules, crate::config::InvalidValue> {
        let names: Vec<(String, Option<String>)> = backends.iter().map(|b| (b.display_name(), b.group.clone())).collect();
        let mut out = Rules {
            list: Vec::new(),
            patterns: Vec::new(),
            pattern_rule: Vec::new(),
            unpatterned: Vec::new(),
            matches: (0..shards.max(1)).map(|_| Mutex::default()).collect(),
            backends: names,
        };
        for (i, r) in rules.iter().enumerate() {
            let name = r.name(i);
            let bad = |m: String| crate::config::InvalidValue(format!("rules {name:?}: {m}"));
            let bad_value = |m: crate::config::InvalidValue| bad(m.0);
            match &r.pattern {
                Some(p) => {
                    out.patterns.push(Regex::new(p.get_ref()).map_err(|e| bad(e.to_string()))?);
                    out.pattern_rule.push(i);
                }
                None => out.unpatterned.push(i),
            }
            let action = Action {
                route: r
                    .route
                    .as_ref()
                    .map(|t| out.route_to(t.get_ref()).ok_or_else(|| bad(format!("no backend or group {:?}", t.get_ref()))))
                    .transpose()?,
                block: r.block.clone().map(|m| (r.error_code, m)),
                rewrite: match (&r.rewrite, &r.replace) {
                    (Some(p), Some(with)) => Some((Regex::new(p.get_ref()).map_err(|e| bad(e.to_string()))?, with.clone())),
                    _ => None,
                },
                mirror: r
                    .mirror
                    .as_ref()
                    .map(|m| out.index_of(m.get_ref()).ok_or_else(|| bad(format!("no backend {:?}", m.get_ref()))))
                    .transpose()?,
                timeout: r.timeout,
                cache_ttl: r.cache_ttl,
            };
            let (hits, timeouts) = metrics.rule(&name);
            out.list.push(Rule {
                name: name.clone(),
                user: r.user.clone(),
                schema: r.schema.clone(),
                client: r.client.as_ref().map(|c| Network::parse(c.get_ref())).transpose().map_err(bad_value)?,
                digest: r.digest.as_ref().map(|d| parse_digest(d.get_ref())).transpose().map_err(bad_value)?,
                action,
                hits,
                timeouts,
            });
        }
        Ok(out)
    }

    /// What a route names: "primary", "replica", a backend, or a group of them.
    pub fn route_to(&self, target: &str) -> Option<RouteTo> {
        match target {
            "primary" => return Some(RouteTo::Primary),
            "replica" => return Some(RouteTo::Replica),
            _ => {}
        }
        let mask = self
            .backends
            .iter()
            .enumerate()
            .filter(|(i, (name, group))| *i < 64 && (name == target || group.as_deref() == Some(target)))
            .fold(0u64, |m, (i, _)| m | 1 << i);
        (mask != 0).then_some(RouteTo::Among(mask))
    }

    fn index_of(&self, name: &str) -> Option<usize> {
        self.backends.iter().position(|(n, _)| n == name)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The rule a statement falls under (its index), counting the hit.
    pub fn find(&self, who: &Who<'_>, digest: u64, text: &[u8]) -> Option<usize> {
        if self.list.is_empty() {
            return None;
        }
        let mut found = None;
        self.with_matches(digest, text, who.mode, |matched| {
            // The candidates in order: rules without a pattern, and those whose pattern matched
            // (patterns are numbered in the order of their rules).
            let mut plain = self.unpatterned.iter().copied().peekable();
            let mut hit = (0..self.patterns.len())
                .filter(|&p| matched.is_some_and(|m| m[p / 64] >> (p % 64) & 1 == 1))
                .map(|p| self.pattern_rule[p])
                .peekable();
            let fits = |r: &Rule| {
                r.digest.is_none_or(|d| d == digest)
                    && r.user.as_deref().is_none_or(|u| u == who.user)
                    && r.schema.as_deref().is_none_or(|s| who.schema == Some(s))
                    && r.client.is_none_or(|n| who.client.is_some_and(|ip| n.contains(ip)))
            };
            found = std::iter::from_fn(|| match (plain.peek(), hit.peek()) {
                (Some(&a), Some(&b)) if a < b => plain.next(),
                (_, Some(_)) => hit.next(),
                (Some(_), None) => plain.next(),
                (None, None) => None,
            })
            .find(|&i| fits(&self.list[i]));
        });
        if let Some(i) = found {
            self.list[i].hits.inc();
        }
        found
    }

    /// Calls `f` with the patterns the digest's text matches (None: there are no patterns).
    fn with_matches(&self, digest: u64, text: &[u8], mode: sluice_proto::lexer::Mode, f: impl FnOnce(Option<&[u64]>)) {
        if self.patterns.is_empty() {
            return f(None);
        }
        let mut m = self.matches[crate::worker::shard() % self.matches.len()].lock();
        if !m.contains_key(&digest) {
            if m.len() >= MATCHES_KEPT {
                m.clear();
            }
            let mut normalized = Vec::with_capacity(text.len());
            sluice_proto::digest::normalize_in(text, mode, &mut normalized, usize::MAX);
            let mut bits = vec![0u64; self.patterns.len().div_ceil(64)].into_boxed_slice();
            for (i, p) in self.patterns.iter().enumerate() {
                if p.is_match(&normalized) {
                    bits[i / 64] |= 1 << (i % 64);
                }
            }
            m.insert(digest, bits);
        }
        f(m.get(&digest).map(|b| &b[..]))
    }
}

/// The route a `/* sluice: route=... */` comment gives, if the statement has one (the target
/// as written; the caller resolves it).
pub fn hint(text: &[u8]) -> Option<&[u8]> {
    let at = memchr::memmem::find(text, b"sluice:")?;
    let before = text[..at].trim_ascii_end();
    if !before.ends_with(b"/*") {
        return None;
    }
    let rest = &text[at + 7..];
    let end = memchr::memmem::find(rest, b"*/")?;
    let body = &rest[..end];
    body.split(|&c| c == b' ' || c == b',').find_map(|kv| kv.strip_prefix(b"route=")).filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn rules(text: &str) -> Rules {
        let backends = "[[backends]]\naddress = \"127.0.0.1:3306\"\nname = \"a\"\ngroup = \"reports\"\n[[backends]]\naddress = \"127.0.0.1:3307\"\nname = \"b\"\ngroup = \"reports\"\n[[backends]]\naddress = \"127.0.0.1:3308\"\nname = \"c\"\n";
        let cfg = Config::parse(&format!("{backends}{text}")).expect("config");
        Rules::new(&cfg.rules, &cfg.backends, 2, &crate::metrics::Metrics::new(&[])).expect("rules")
    }

    fn who(user: &str) -> Who<'_> {
        Who { user, schema: Some("shop"), client: Some("10.1.2.3".parse().unwrap()), mode: Default::default() }
    }

    fn find(r: &Rules, user: &str, sql: &str) -> Option<String> {
        r.find(&who(user), sluice_proto::digest::digest(sql.as_bytes()), sql.as_bytes()).map(|i| r.list[i].name.clone())
    }

    #[test]
    fn the_first_rule_whose_conditions_all_hold_applies() {
        let r = rules(
            r#"
[[rules]]
name = "no-drop"
match = "^drop "
block = "not here"
[[rules]]
name = "reports"
user = "analyst"
match = "from orders"
route = "reports"
[[rules]]
name = "net"
client = "10.0.0.0/8"
schema = "shop"
route = "c"
[[rules]]
match = "sleep"
timeout = "1s"
"#,
        );
        assert_eq!(find(&r, "app", "DROP TABLE t").as_deref(), Some("no-drop"));
        assert_eq!(find(&r, "analyst", "SELECT * FROM orders WHERE id = 1").as_deref(), Some("reports"));
        assert_eq!(find(&r, "app", "SELECT * FROM orders WHERE id = 1").as_deref(), Some("net"));
        let far = Who { user: "app", schema: Some("shop"), client: Some("192.168.1.1".parse().unwrap()), mode: Default::default() };
        assert_eq!(
            r.find(&far, sluice_proto::digest::digest(b"select sleep(1)"), b"select sleep(1)").map(|i| r.list[i].name.as_str()),
            Some("rule-4")
        );
        assert_eq!(r.find(&far, 7, b"select 1"), None);
        assert_eq!(r.list[1].hits.get(), 1);
        assert_eq!(r.list[1].action.route, Some(RouteTo::Among(0b011)));
        assert_eq!(r.list[2].action.route, Some(RouteTo::Among(0b100)));
        // Patterns see the normalized text: literals do not match.
        assert_eq!(r.find(&far, sluice_proto::digest::digest(b"SELECT 'drop ' FROM t"), b"SELECT 'drop ' FROM t"), None);
    }

    #[test]
    fn a_digest_rule_matches_its_shape_only() {
        let d = sluice_proto::digest::hex(sluice_proto::digest::digest(b"SELECT c FROM t WHERE id = 1"));
        let r = rules(&format!("[[rules]]\ndigest = \"{d}\"\nroute = \"primary\"\n"));
        assert!(find(&r, "u", "select c from t where id = 99").is_some());
        assert!(find(&r, "u", "select d from t where id = 99").is_none());
    }

    #[test]
    fn a_comment_names_a_route() {
        assert_eq!(hint(b"/* sluice: route=primary */ SELECT 1"), Some(&b"primary"[..]));
        assert_eq!(hint(b"SELECT /*sluice:route=reports*/ 1"), Some(&b"reports"[..]));
        assert_eq!(hint(b"SELECT 'sluice: route=primary'"), None);
        assert_eq!(hint(b"/* sluice: route= */ SELECT 1"), None);
    }

    #[test]
    fn bad_rules_fail_with_their_line() {
        let base = "[[backends]]\naddress = \"127.0.0.1:3306\"\n";
        for (rule, line, says) in [
            ("[[rules]]\nmatch = \"(unclosed\"\nblock = \"x\"\n", 4, "match"),
            ("[[rules]]\nuser = \"u\"\nroute = \"nowhere\"\n", 5, "no backend or group"),
            ("[[rules]]\nclient = \"10.0.0.0/33\"\nblock = \"x\"\n", 4, "prefix"),
            ("[[rules]]\ndigest = \"xyz\"\nblock = \"x\"\n", 4, "16 hexadecimal"),
            ("[[rules]]\nmatch = \"a\"\n", 4, "does nothing"),
        ] {
            let e = Config::parse(&format!("{base}{rule}")).unwrap_err();
            assert_eq!(e.line, Some(line), "{rule}: {}", e.message);
            assert!(e.message.contains(says), "{rule}: {}", e.message);
        }
    }
}
