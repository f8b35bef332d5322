//! A small map of names to values (session variables, user variables, statements prepared with
//! SQL). Most sessions have none or a few entries, and an idle session's memory counts, so the
//! entries are kept in one string with their spans sorted by name (three allocations, however
//! many entries; a `BTreeMap` takes a node of about 500 bytes for its first), and copies share
//! them until one changes (the session's state, the copy it publishes for the admin API and the
//! state of the connection it last used are then one).

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(Option<Arc<Entries>>);

#[derive(Debug, Default, PartialEq, Eq)]
struct Entries {
    /// Each entry's name and value, one after the other.
    text: Box<str>,
    /// By name: where its name starts, where it ends (its value starts), where its value ends.
    spans: Box<[[u32; 3]]>,
}

impl Entries {
    fn name(&self, s: &[u32; 3]) -> &str {
        &self.text[s[0] as usize..s[1] as usize]
    }

    fn value(&self, s: &[u32; 3]) -> &str {
        &self.text[s[1] as usize..s[2] as usize]
    }
}

/// The entries of a [`Vars`], by name.
#[derive(Clone)]
pub struct Iter<'a> {
    entries: Option<&'a Entries>,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let e = self.entries?;
        let s = e.spans.get(self.next)?;
        self.next += 1;
        Some((e.name(s), e.value(s)))
    }
}

impl<'a> IntoIterator for &'a Vars {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl Vars {
    fn find(&self, name: &str) -> Result<usize, usize> {
        match &self.0 {
            None => Err(0),
            Some(e) => e.spans.binary_search_by(|s| e.name(s).cmp(name)),
        }
    }

    /// Made again from `pairs`, sorted by name (none: empty).
    fn from_sorted<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Vars {
        let len: usize = pairs.clone().map(|(n, v)| n.len() + v.len()).sum();
        let mut text = String::with_capacity(len);
        let mut spans = Vec::with_capacity(pairs.clone().count());
        for (n, v) in pairs {
            let start = text.len() as u32;
            text.push_str(n);
            let mid = text.len() as u32;
            text.push_str(v);
            spans.push([start, mid, text.len() as u32]);
        }
        if spans.is_empty() {
            return Vars(None);
        }
        Vars(Some(Arc::new(Entries { text: text.into_boxed_str(), spans: spans.into_boxed_slice() })))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        let i = self.find(name).ok()?;
        self.0.as_deref().map(|e| e.value(&e.spans[i]))
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name` to `value`; returns the value it had.
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        let (at, old) = match self.find(&name) {
            Ok(i) => (i, self.get(&name).map(str::to_string)),
            Err(i) => (i, None),
        };
        if old.as_deref() == Some(value.as_str()) {
            return old;
        }
        let skip = usize::from(old.is_some());
        let next = {
            let before = self.iter().take(at);
            let after = self.iter().skip(at + skip);
            Vars::from_sorted(before.chain(std::iter::once((name.as_str(), value.as_str()))).chain(after))
        };
        *self = next;
        old
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        let i = self.find(name).ok()?;
        let old = self.get(name).map(str::to_string);
        let next = Vars::from_sorted(self.iter().take(i).chain(self.iter().skip(i + 1)));
        *self = next;
        old
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }

    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |e| e.spans.len())
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Names and values, by name.
    pub fn iter(&self) -> Iter<'_> {
        Iter { entries: self.0.as_deref(), next: 0 }
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.iter().map(|(n, _)| n)
    }
}

/// As a map of names to values.
impl Serialize for Vars {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len()))?;
        for (n, v) in self.iter() {
            m.serialize_entry(n, v)?;
        }
        m.end()
    }
}

/// From a map of names to values.
impl<'de> serde::Deserialize<'de> for Vars {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Vars, D::Error> {
        let m = std::collections::BTreeMap::<String, String>::deserialize(d)?;
        let mut v = Vars::default();
        for (n, value) in m {
            v.insert(n, value);
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sorted_map() {
        let mut v = Vars::default();
        assert_eq!(v.insert("b".into(), "2".into()), None);
        assert_eq!(v.insert("a".into(), "1".into()), None);
        assert_eq!(v.insert("c".into(), "3".into()), None);
        assert_eq!(v.insert("b".into(), "two".into()), Some("2".into()));
        assert_eq!(v.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(v.get("b"), Some("two"));
        assert!(v.contains_key("c") && !v.contains_key("d"));
        assert_eq!(v.remove("a"), Some("1".into()));
        assert_eq!(v.remove("a"), None);
        assert_eq!(v.len(), 2);
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"b":"two","c":"3"}"#);
        assert_eq!(serde_json::from_str::<Vars>(r#"{"b":"two","c":"3"}"#).unwrap(), v);
        let w = v.clone();
        assert_eq!(v, w);
        // A copy shares the pairs until one side changes.
        let mut x = w.clone();
        assert!(Arc::ptr_eq(x.0.as_ref().unwrap(), w.0.as_ref().unwrap()));
        x.insert("c".into(), "4".into());
        assert_eq!((w.get("c"), x.get("c")), (Some("3"), Some("4")));
        assert_eq!(x.iter().collect::<Vec<_>>(), [("b", "two"), ("c", "4")]);
        assert_eq!(x.remove("b"), Some("two".into()));
        assert_eq!(x.remove("c"), Some("4".into()));
        assert!(x.is_empty() && x == Vars::default());
        v.clear();
        assert!(v.is_empty());
        assert_eq!(v, Vars::default());
    }
}
