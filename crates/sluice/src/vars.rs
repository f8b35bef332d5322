//! A small map of names to values (session variables, user variables, statements prepared with
//! SQL), kept as a sorted vector of exact size: most sessions have none or a few entries, and an
//! idle session's memory counts (a `BTreeMap` takes a node of about 500 bytes for its first).

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(Vec<(String, String)>);

type Pair = (String, String);

impl Vars {
    fn find(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&String> {
        self.find(name).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name` to `value`; returns the value it had.
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        match self.find(&name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, value)),
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (name, value));
                None
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        let i = self.find(name).ok()?;
        let (_, v) = self.0.remove(i);
        if self.0.is_empty() {
            self.0 = Vec::new();
        }
        Some(v)
    }

    pub fn clear(&mut self) {
        self.0 = Vec::new();
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Names and values, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(n, v)| (n, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.iter().map(|(n, _)| n)
    }
}

impl<'a> IntoIterator for &'a Vars {
    type Item = (&'a String, &'a String);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Pair>, fn(&'a Pair) -> (&'a String, &'a String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(n, v)| (n, v))
    }
}

/// As a map of names to values.
impl Serialize for Vars {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (n, v) in &self.0 {
            m.serialize_entry(n, v)?;
        }
        m.end()
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
        assert_eq!(v.keys().cloned().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(v.get("b").map(String::as_str), Some("two"));
        assert!(v.contains_key("c") && !v.contains_key("d"));
        assert_eq!(v.remove("a"), Some("1".into()));
        assert_eq!(v.remove("a"), None);
        assert_eq!(v.len(), 2);
        assert_eq!(serde_json::to_string(&v).unwrap(), r#"{"b":"two","c":"3"}"#);
        let w = v.clone();
        assert_eq!(v, w);
        v.clear();
        assert!(v.is_empty());
    }
}
