//! Dead-letter blob names, as pure functions.
//!
//! Event Grid names each blob after the subscription and the UTC hour it
//! wrote it, the numbers not zero-padded:
//! - topics and system topics: `<SUBSCRIPTION>/<yyyy>/<M>/<d>/<H>/<guid>.json`
//!   (the subscription's name in upper case);
//! - namespace topics: `<namespace>/<topic>/<subscription>/<yyyy>/<M>/<d>/<H>/<guid>.json`.
//!
//! Blobs the sweep has finished live under [`REPLAYED`] and [`UNREADABLE`]
//! in the same container, with the rest of the name unchanged.

use std::fmt;

/// Where a blob whose events all got a final outcome is moved.
pub const REPLAYED: &str = "replayed/";
/// Where a blob that holds no events is moved (its content is also stored
/// in `RejectedEvents`).
pub const UNREADABLE: &str = "unreadable/";

/// Whose blob this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A topic's or system topic's event subscription.
    Topic { subscription: String },
    /// A namespace topic's event subscription.
    Namespace {
        namespace: String,
        topic: String,
        subscription: String,
    },
}

/// A dead-letter blob name in one of the documented layouts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobName {
    pub source: Source,
    /// The UTC hour Event Grid wrote the blob: year, month, day, hour.
    pub hour: (u16, u8, u8, u8),
    /// The blob's own name without `.json` (a GUID).
    pub id: String,
}

impl BlobName {
    /// `yyyy-mm-ddThh` (sortable), for `list`.
    pub fn hour_text(&self) -> String {
        let (y, m, d, h) = self.hour;
        format!("{y:04}-{m:02}-{d:02}T{h:02}")
    }

    pub fn subscription(&self) -> &str {
        match &self.source {
            Source::Topic { subscription } | Source::Namespace { subscription, .. } => subscription,
        }
    }
}

impl fmt::Display for BlobName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (y, m, d, h) = self.hour;
        match &self.source {
            Source::Topic { subscription } => write!(f, "{subscription}")?,
            Source::Namespace {
                namespace,
                topic,
                subscription,
            } => write!(f, "{namespace}/{topic}/{subscription}")?,
        }
        write!(f, "/{y}/{m}/{d}/{h}/{}.json", self.id)
    }
}

/// Read a blob name (relative to the container) in either layout; `None`
/// for any other name (including the ones under [`REPLAYED`] and
/// [`UNREADABLE`]).
pub fn parse(name: &str) -> Option<BlobName> {
    if is_archived(name) {
        return None;
    }
    let parts: Vec<&str> = name.split('/').collect();
    let (source, rest) = match parts.len() {
        6 => (
            Source::Topic {
                subscription: parts[0].to_string(),
            },
            &parts[1..],
        ),
        8 => (
            Source::Namespace {
                namespace: parts[0].to_string(),
                topic: parts[1].to_string(),
                subscription: parts[2].to_string(),
            },
            &parts[3..],
        ),
        _ => return None,
    };
    if parts[..parts.len() - 5].iter().any(|p| p.is_empty()) {
        return None;
    }
    let num = |s: &str, max: u32| -> Option<u32> {
        // (An empty number fails the parse below.)
        if s.len() > 4 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok().filter(|n| *n <= max)
    };
    let year = num(rest[0], 9999).filter(|y| rest[0].len() == 4 && *y >= 2000)?;
    let month = num(rest[1], 12).filter(|m| *m >= 1)?;
    let day = num(rest[2], 31).filter(|d| *d >= 1)?;
    let hour = num(rest[3], 23)?;
    let id = rest[4].strip_suffix(".json").filter(|s| !s.is_empty())?;
    Some(BlobName {
        source,
        hour: (year as u16, month as u8, day as u8, hour as u8),
        id: id.to_string(),
    })
}

/// Whether the name is one the sweep already moved.
pub fn is_archived(name: &str) -> bool {
    name.starts_with(REPLAYED) || name.starts_with(UNREADABLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_documented_layouts() {
        let n = parse("MY-BLOB-SUBSCRIPTION/2019/8/8/5/111111111-1111-1111-1111-111111111111.json")
            .unwrap();
        assert_eq!(
            n.source,
            Source::Topic {
                subscription: "MY-BLOB-SUBSCRIPTION".into()
            }
        );
        assert_eq!(n.hour, (2019, 8, 8, 5));
        assert_eq!(n.id, "111111111-1111-1111-1111-111111111111");
        assert_eq!(n.hour_text(), "2019-08-08T05");
        assert_eq!(
            n.to_string(),
            "MY-BLOB-SUBSCRIPTION/2019/8/8/5/111111111-1111-1111-1111-111111111111.json"
        );
        let n = parse("mynamespace/mytopic/myeventsubscription/2023/9/23/2/480b2295-0c38-40d0-b25a-f34b30aac1a9.json").unwrap();
        assert_eq!(
            n.source,
            Source::Namespace {
                namespace: "mynamespace".into(),
                topic: "mytopic".into(),
                subscription: "myeventsubscription".into()
            }
        );
        assert_eq!(n.subscription(), "myeventsubscription");
        assert_eq!(n.hour, (2023, 9, 23, 2));
        // Padded numbers are read too (the documented form is not padded).
        assert_eq!(
            parse("S/2024/01/02/03/x.json").unwrap().hour,
            (2024, 1, 2, 3)
        );
    }

    #[test]
    fn other_names_are_not_dead_letters() {
        for name in [
            "replayed/S/2019/8/8/5/g.json",
            "unreadable/S/2019/8/8/5/g.json",
            "S/2019/8/8/5/g.txt",
            "S/2019/8/8/5/.json",
            "S/2019/13/8/5/g.json",
            "S/2019/8/0/5/g.json",
            "S/2019/8/8/24/g.json",
            "S/19/8/8/5/g.json",
            "S/2019/8/8/g.json",
            "/2019/8/8/5/g.json",
            "a/b/c/d/S/2019/8/8/5/g.json",
            "S/2019/+8/8/5/g.json",
            "ns//sub/2019/8/8/5/g.json",
            // Padded past four digits, a year before 2000, an empty number.
            "S/2019/00012/8/5/g.json",
            "S/1999/8/8/5/g.json",
            "S/2019//8/5/g.json",
        ] {
            assert_eq!(parse(name), None, "{name}");
        }
        assert!(is_archived("replayed/x"));
        assert!(!is_archived("REPLAYED/x"));
    }
}
