//! The version of an object a GET must be answered with, as its listing gave it, and the check
//! of an answer against it: by size, by ETag, and, where the store lists no ETags, by the
//! last-modified second.

use chrono::{DateTime, Utc};
use object_store::ObjectMeta;
use tracing::warn;

/// The version of an object a GET must be answered with: the one its listing gave.
#[derive(Debug, Clone, Default)]
pub(super) struct Listed {
    /// Its ETag: asked for (If-Match) and compared with the answer's.
    pub(super) e_tag: Option<String>,
    /// The whole object's size: compared with the answer's.
    pub(super) size: Option<u64>,
    /// Its last-modified time: compared, to the second, with the answer's where the listing
    /// gives no ETag (some S3-compatible stores list none).
    pub(super) last_modified: Option<DateTime<Utc>>,
}

impl Listed {
    /// The version of `object` as listed.
    pub(super) fn of(object: &ObjectMeta) -> Listed {
        Listed::of_whole(object, object.size)
    }

    /// The version of the object `meta` lists (or a range of it lists: the object's ETag and
    /// time), `size` bytes long in all. A time of 0 is none given (object_store reads a HEAD
    /// answer without one so).
    pub(super) fn of_whole(meta: &ObjectMeta, size: u64) -> Listed {
        Listed {
            e_tag: meta.e_tag.clone(),
            size: Some(size),
            last_modified: (meta.last_modified.timestamp() != 0).then_some(meta.last_modified),
        }
    }

    /// Whether a GET answered with another version (`answered` is the answer's metadata) than
    /// this one: another size, another ETag (compared without quotes, weak mark and case:
    /// stores quote them in one place and not another), or, with no ETag listed, another
    /// last-modified second. What either side leaves out tells nothing.
    pub(super) fn answered_by_another(&self, answered: &ObjectMeta) -> bool {
        let bare = |tag: &str| {
            tag.trim_start_matches("W/")
                .trim_matches('"')
                .to_ascii_lowercase()
        };
        let why = if self.size.is_some_and(|size| size != answered.size) {
            "size"
        } else if let (Some(listed), Some(answer)) = (&self.e_tag, &answered.e_tag) {
            if bare(listed) == bare(answer) {
                return false;
            }
            "ETag"
        } else if self.e_tag.is_none()
            && answered.last_modified.timestamp() != 0
            && self
                .last_modified
                .is_some_and(|listed| listed.timestamp() != answered.last_modified.timestamp())
        {
            "last-modified time"
        } else {
            return false;
        };
        // Said, so that a store whose listings and answers spell one version two ways shows
        // why every read of it fails.
        warn!(
            what = why,
            listed = ?self,
            answered = ?(answered.size, &answered.e_tag, answered.last_modified),
            "a GET answered with another version than the listing's"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use object_store::path::Path as ObjectPath;

    use super::*;

    /// An answer of another version is told by its size, its ETag (spelt with or without
    /// quotes, as stores spell it one way in listings and another in answers), or, where the
    /// listing gives no ETag (s3s-fs, some S3-compatible stores), its last-modified second:
    /// before, an object rewritten on such a store was read as the version listed.
    #[test]
    fn an_answer_of_another_version_is_told_with_or_without_etags() {
        use chrono::TimeZone;
        let at =
            |seconds: i64, ms: u32| Utc.timestamp_opt(seconds, ms * 1_000_000).single().unwrap();
        let meta = |size: u64, e_tag: Option<&str>, modified| ObjectMeta {
            location: ObjectPath::from("set/a.bin"),
            last_modified: modified,
            size,
            e_tag: e_tag.map(str::to_owned),
            version: None,
        };
        let listed = Listed::of(&meta(10, Some("\"abc\""), at(1000, 250)));
        assert!(!listed.answered_by_another(&meta(10, Some("ABC"), at(2000, 0))));
        assert!(listed.answered_by_another(&meta(10, Some("\"abd\""), at(1000, 0))));
        assert!(listed.answered_by_another(&meta(11, Some("\"abc\""), at(1000, 0))));
        // No ETag answered: the size alone tells.
        assert!(!listed.answered_by_another(&meta(10, None, at(5000, 0))));

        let untagged = Listed::of(&meta(10, None, at(1000, 250)));
        // The same second, spelt to the second in the answer's header.
        assert!(!untagged.answered_by_another(&meta(10, Some("\"md5\""), at(1000, 0))));
        assert!(untagged.answered_by_another(&meta(10, Some("\"md5\""), at(1001, 0))));
        assert!(untagged.answered_by_another(&meta(12, None, at(1000, 0))));
        // An answer without a last-modified time tells nothing by it.
        assert!(!untagged.answered_by_another(&meta(10, None, at(0, 0))));
        // Nor a listing (a HEAD answered) without one.
        let timeless = Listed::of(&meta(10, None, at(0, 0)));
        assert!(!timeless.answered_by_another(&meta(10, Some("\"md5\""), at(1000, 0))));
    }
}
