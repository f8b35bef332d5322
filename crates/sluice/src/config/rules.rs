//! `[[rules]]` (query rules) and `[digests]`.
//!
//! A rule matches statements on any of user, schema, client address, digest and a regular
//! expression over the normalized text (all that are given must match), and acts on them:
//! route, block, rewrite, mirror, time out, cache. Rules are tried in order; the first that
//! matches applies. Everything a rule names is checked when the file is read, and an error
//! names the rule's line.

use std::net::IpAddr;
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::ConfigError;

#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    /// For metrics and the admin API; defaults to "rule-N" (N counts from 1).
    pub name: Option<String>,
    pub user: Option<String>,
    pub schema: Option<String>,
    /// The client's address: an IP address or a network (`10.0.0.0/8`).
    pub client: Option<Spanned<String>>,
    /// A digest as `/digests` shows it (16 hexadecimal digits).
    pub digest: Option<Spanned<String>>,
    /// A regular expression searched in the normalized text (keywords in lower case, literals
    /// as `?`; `(?i)` for other words without case).
    #[serde(rename = "match")]
    pub pattern: Option<Spanned<String>>,
    /// "primary", "replica", or the name of a backend or of a group of backends.
    pub route: Option<Spanned<String>>,
    /// Refuse the statement with this message.
    pub block: Option<String>,
    /// The error code of a blocked statement (SQLSTATE 42000).
    #[serde(default = "blocked_code")]
    pub error_code: u16,
    /// A regular expression searched in the statement's own text, and what replaces each match
    /// (`$1` and `${name}` name groups): the statement that runs is the rewritten one.
    pub rewrite: Option<Spanned<String>>,
    pub replace: Option<String>,
    /// A backend that also receives the statement; its answers are discarded.
    pub mirror: Option<Spanned<String>>,
    /// A statement still running after this long is killed on its backend (KILL QUERY).
    #[serde(default, deserialize_with = "super::optional_duration", serialize_with = "super::show_optional_duration")]
    pub timeout: Option<Duration>,
    /// Reads whose results are kept and served again for this long.
    #[serde(default, deserialize_with = "super::optional_duration", serialize_with = "super::show_optional_duration")]
    pub cache_ttl: Option<Duration>,
}

fn blocked_code() -> u16 {
    1148
}

/// `[digests]`: statistics per statement digest.
#[derive(Debug, Clone, Deserialize, serde::Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DigestsConfig {
    /// Unset (the default): counted in users-mode sessions, where a digest costs under 1% of
    /// the relay's instructions per query, as they read every statement anyway (README, "Query
    /// rules and digests"). `true`: in passthrough sessions too, whose statements sluice
    /// otherwise does not read (there a digest costs the lexer's pass, about 18% of the
    /// relay's instructions). `false`: in none.
    pub enabled: Option<bool>,
    /// At most this many digests are kept (per worker); the least recently used go first.
    pub max: usize,
    /// The normalized text kept of each digest is cut at this many bytes.
    pub text_limit: usize,
}

impl Default for DigestsConfig {
    fn default() -> Self {
        DigestsConfig { enabled: None, max: 5000, text_limit: 1024 }
    }
}

/// A network a client address may fall in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Network {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Network {
    pub fn parse(s: &str) -> Result<Network, super::InvalidValue> {
        let (a, p) = s.split_once('/').map_or((s, None), |(a, p)| (a, Some(p)));
        let addr: IpAddr = a.trim().parse().map_err(|_| super::InvalidValue(format!("{s:?} is not an IP address or network")))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match p {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| super::InvalidValue(format!("{s:?}: prefix length must be 0 to {max}")))?,
            None => max,
        };
        Ok(Network { addr, prefix })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = ((bits / 8) as usize, bits % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0)
}

/// Parses a digest as shown (16 hexadecimal digits).
pub fn parse_digest(s: &str) -> Result<u64, super::InvalidValue> {
    let t = s.trim().trim_start_matches("0x");
    let invalid = || super::InvalidValue(format!("digest {s:?}: expected 16 hexadecimal digits"));
    if t.len() != 16 {
        return Err(invalid());
    }
    u64::from_str_radix(t, 16).map_err(|_| invalid())
}

impl RuleConfig {
    /// The name rules are known by.
    pub fn name(&self, i: usize) -> String {
        self.name.clone().unwrap_or_else(|| format!("rule-{}", i + 1))
    }

    /// Checks a rule: what it matches compiles, what it names exists (`targets`: backend and
    /// group names), and it does something.
    pub fn check(&self, i: usize, text: &str, targets: &[&str]) -> Result<(), ConfigError> {
        let line = self.first_line(text);
        let name = self.name(i);
        let err = |span: Option<std::ops::Range<usize>>, m: String| ConfigError {
            file: None,
            line: span.map(|s| super::line_of(text, s.start)).or(line),
            message: format!("rules {name:?}: {m}"),
        };
        if let Some(n) = &self.name {
            super::check_name("rules.name", n).map_err(|m| err(None, m.0))?;
        }
        if let Some(c) = &self.client {
            Network::parse(c.get_ref()).map_err(|m| err(Some(c.span()), format!("client: {m}")))?;
        }
        if let Some(d) = &self.digest {
            parse_digest(d.get_ref()).map_err(|m| err(Some(d.span()), m.0))?;
        }
        for (key, re) in [("match", &self.pattern), ("rewrite", &self.rewrite)] {
            if let Some(re) = re {
                regex::bytes::Regex::new(re.get_ref()).map_err(|e| err(Some(re.span()), format!("{key}: {e}")))?;
            }
        }
        if self.rewrite.is_some() != self.replace.is_some() {
            return Err(err(None, "rewrite and replace go together".into()));
        }
        for (key, target) in [("route", &self.route), ("mirror", &self.mirror)] {
            if let Some(t) = target {
                let known =
                    targets.contains(&t.get_ref().as_str()) || (key == "route" && matches!(t.get_ref().as_str(), "primary" | "replica"));
                if !known {
                    return Err(err(Some(t.span()), format!("{key}: no backend or group is named {:?}", t.get_ref())));
                }
            }
        }
        if self.block.is_some() && (self.route.is_some() || self.rewrite.is_some() || self.mirror.is_some() || self.cache_ttl.is_some()) {
            return Err(err(None, "a blocking rule does nothing else".into()));
        }
        let acts = self.block.is_some()
            || self.route.is_some()
            || self.rewrite.is_some()
            || self.mirror.is_some()
            || self.timeout.is_some()
            || self.cache_ttl.is_some();
        if !acts {
            return Err(err(None, "does nothing: give route, block, rewrite, mirror, timeout or cache_ttl".into()));
        }
        Ok(())
    }

    /// The line of the first key of the rule that knows its place.
    fn first_line(&self, text: &str) -> Option<usize> {
        [&self.client, &self.digest, &self.pattern, &self.route, &self.rewrite, &self.mirror]
            .into_iter()
            .flatten()
            .map(|s| s.span().start)
            .min()
            .map(|at| super::line_of(text, at))
    }
}
