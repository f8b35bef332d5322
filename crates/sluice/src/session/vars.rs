//! A small map of names to values (session variables, user variables, statements prepared with
//! SQL). Most sessions have none or a few entries, and an idle session's memory counts, so the
//! entries are kept sorted by name in one allocation, each its name's length, its value's
//! length (LEB128 varints) and the two (a `BTreeMap` takes a node of about 500 bytes for
//! its first), and copies share them until one changes (the session's state, the copy it
//! publishes for the admin API and the state of the connection it last used are then one).

use std::sync::Arc;

use serde::ser::{Serialize, SerializeMap, Serializer};

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Vars(Option<Arc<[u8]>>);

/// The entries of a [`Vars`], by name.
#[derive(Clone)]
pub struct Iter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let n = take_varint(&mut self.rest)?;
        let v = take_varint(&mut self.rest)?;
        let (name, rest) = self.rest.split_at_checked(n)?;
        let (value, rest) = rest.split_at_checked(v)?;
        self.rest = rest;
        // (Written from `&str`s by `from_sorted`.)
        Some((std::str::from_utf8(name).unwrap_or_default(), std::str::from_utf8(value).unwrap_or_default()))
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: usize) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn take_varint(b: &mut &[u8]) -> Option<usize> {
    let mut v = 0usize;
    for shift in (0..usize::BITS).step_by(7) {
        let (&x, rest) = b.split_first()?;
        *b = rest;
        v |= usize::from(x & 0x7f) << shift;
        if x < 0x80 {
            return Some(v);
        }
    }
    None
}

impl<'a> IntoIterator for &'a Vars {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl Vars {
    /// Where `name` is (its place in the order), or where it would go.
    fn find(&self, name: &str) -> Result<usize, usize> {
        for (i, (n, _)) in self.iter().enumerate() {
            match n.cmp(name) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(i),
                std::cmp::Ordering::Greater => return Err(i),
            }
        }
        Err(self.len())
    }

    /// Made again from `pairs`, sorted by name (none: empty).
    fn from_sorted<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) -> Vars {
        let varint = |n: usize| (usize::BITS - n.leading_zeros()).div_ceil(7).max(1) as usize;
        let len: usize = pairs.clone().map(|(n, v)| varint(n.len()) + varint(v.len()) + n.len() + v.len()).sum();
        if len == 0 {
            return Vars(None);
        }
        let mut out = Vec::with_capacity(len);
        for (n, v) in pairs {
            put_varint(&mut out, n.len());
            put_varint(&mut out, v.len());
            out.extend_from_slice(n.as_bytes());
            out.extend_from_slice(v.as_bytes());
        }
        Vars(Some(out.into()))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
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
        self.iter().count()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Names and values, by name.
    pub fn iter(&self) -> Iter<'_> {
        Iter { rest: self.0.as_deref().unwrap_or_default() }
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
        // Lengths past one varint byte.
        let long = "x".repeat(300);
        x.insert(long.clone(), long.repeat(1000));
        x.insert("a".into(), String::new());
        assert_eq!(x.get(&long).map(str::len), Some(300_000));
        assert_eq!(x.iter().map(|(n, v)| (n.len(), v.len())).collect::<Vec<_>>(), [(1, 0), (300, 300_000)]);
        assert_eq!(x.0.as_ref().unwrap().len(), 1 + 1 + 1 + 2 + 3 + 300 + 300_000);
        v.clear();
        assert!(v.is_empty());
        assert_eq!(v, Vars::default());
    }
}
