//! A small map of names to values (session variables, user variables, statements prepared with
//! SQL), kept as a sorted vector of exact size: most sessions have none or a few entries, and an
//! idle session's memory counts (a `BTreeMap` takes a node of about 500 bytes for its first).
//! Copies share the vector until one of them changes (the session's state and the copy it
//! publishes for the admin API are then one).

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(Option<Arc<Vec<Pair>>>);

type Pair = (String, String);

impl Vars {
    fn pairs(&self) -> &[Pair] {
        self.0.as_deref().map_or(&[], Vec::as_slice)
    }

    /// The pairs to change (copied first when shared).
    fn pairs_mut(&mut self) -> &mut Vec<Pair> {
        Arc::make_mut(self.0.get_or_insert_with(Default::default))
    }

    fn find(&self, name: &str) -> Result<usize, usize> {
        self.pairs().binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&String> {
        self.find(name).ok().map(|i| &self.pairs()[i].1)
    }

    pub fn contains_key(&self, name: &str) -> bool {
        self.find(name).is_ok()
    }

    /// Sets `name` to `value`; returns the value it had.
    pub fn insert(&mut self, name: String, value: String) -> Option<String> {
        match self.find(&name) {
            Ok(i) if self.pairs()[i].1 == value => Some(value),
            Ok(i) => Some(std::mem::replace(&mut self.pairs_mut()[i].1, value)),
            Err(i) => {
                let v = self.pairs_mut();
                v.reserve_exact(1);
                v.insert(i, (name, value));
                None
            }
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        let i = self.find(name).ok()?;
        if self.len() == 1 {
            let value = self.pairs()[0].1.clone();
            self.0 = None;
            return Some(value);
        }
        Some(self.pairs_mut().remove(i).1)
    }

    pub fn clear(&mut self) {
        self.0 = None;
    }

    pub fn len(&self) -> usize {
        self.pairs().len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs().is_empty()
    }

    /// Names and values, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.pairs().iter().map(|(n, v)| (n, v))
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.pairs().iter().map(|(n, _)| n)
    }
}

impl<'a> IntoIterator for &'a Vars {
    type Item = (&'a String, &'a String);
    type IntoIter = std::iter::Map<std::slice::Iter<'a, Pair>, fn(&'a Pair) -> (&'a String, &'a String)>;

    fn into_iter(self) -> Self::IntoIter {
        self.pairs().iter().map(|(n, v)| (n, v))
    }
}

/// As a map of names to values.
impl Serialize for Vars {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len()))?;
        for (n, v) in self.pairs() {
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
        // A copy shares the pairs until one side changes.
        let mut x = w.clone();
        assert!(Arc::ptr_eq(x.0.as_ref().unwrap(), w.0.as_ref().unwrap()));
        x.insert("c".into(), "4".into());
        assert_eq!((w.get("c").map(String::as_str), x.get("c").map(String::as_str)), (Some("3"), Some("4")));
        v.clear();
        assert!(v.is_empty());
        assert_eq!(v, Vars::default());
    }
}
