//! The index object of a tar shard set in an object store: every shard's name, size and ETag
//! and, per sample, where its image member's bytes lie, its label and its member name. With it
//! an `s3://` set opens with one listing and one GET, whatever its number of shards (up to about
//! 20 million samples: an index over 1 GiB once decompressed is neither written nor read).
//!
//! Who writes it: `stoker index s3://BUCKET/PREFIX` (for an existing WebDataset set: each shard
//! is read once, start to end, and scanned), which puts it at `PREFIX/stoker-tar-index.bin`.
//! A set opened without one (or with one that no longer matches the listing, or that cannot be
//! decoded) is scanned the same way at open, with a warning, and the index is kept in the local
//! cache folder (`tar-indexes/`) so the next open on this machine does not scan again.
//!
//! Encoding (zstd-compressed): `STKTIDX3`, the shard count (u32 LE), then per shard its name
//! (u16 length + UTF-8), size (u64), ETag (u16 length + bytes; 0: none), problem count (u64),
//! sample count (u32) and per sample data offset (u64), size (u64), label (i64), member name
//! (u16 length + bytes).

use std::io::Read;

use object_store::ObjectMeta;

use super::scan::{IndexedSample, ShardIndex};
use crate::error::{Error, Result, TarSetError};

/// The index object's name under the set's prefix.
pub const TAR_INDEX_OBJECT: &str = "stoker-tar-index.bin";

/// `STKTIDX3`: the indexing rules as `scan` applies them since members whose file name starts
/// with a dot (macOS's AppleDouble `._0001.jpg`) belong to no sample (`STKTIDX2` indexes took
/// them for members, each ending the sample before it; `STKTIDX1` ones, older, left out the
/// samples whose image was a `.webp`, `.bmp`, `.tif`, `.gif` or `.pnm`): earlier ones are
/// scanned again; the rules' next change takes the next number.
const MAGIC: &[u8; 8] = b"STKTIDX3";
/// The magic of indexes written under earlier rules.
const EARLIER_MAGIC: &[u8; 7] = b"STKTIDX";

/// One shard of an index: its object as listed when indexed, and its samples.
#[derive(Debug)]
pub(crate) struct IndexedShard {
    /// The shard's file name under the prefix.
    pub(crate) name: String,
    /// Its size and ETag when indexed.
    pub(crate) size: u64,
    pub(crate) e_tag: Option<String>,
    pub(crate) index: ShardIndex,
}

impl IndexedShard {
    /// Whether `object` is the shard this index describes.
    pub(crate) fn describes(&self, object: &ObjectMeta) -> bool {
        object.location.filename() == Some(self.name.as_str())
            && object.size == self.size
            && object.e_tag == self.e_tag
    }
}

fn put_str(out: &mut Vec<u8>, text: &[u8]) -> Result<()> {
    let len = u16::try_from(text.len())
        .map_err(|_| Error::InvalidArgument("a name in the tar index is over 64 KiB".into()))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(text);
    Ok(())
}

/// The index object's bytes for `shards`; refused when it would take more than `max_bytes` once
/// decompressed (what [`decode`] with the same bound would refuse).
pub(crate) fn encode(shards: &[IndexedShard], max_bytes: usize) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(shards.len() as u32).to_le_bytes());
    for shard in shards {
        put_str(&mut out, shard.name.as_bytes())?;
        out.extend_from_slice(&shard.size.to_le_bytes());
        put_str(
            &mut out,
            shard.e_tag.as_deref().unwrap_or_default().as_bytes(),
        )?;
        out.extend_from_slice(&shard.index.problems.to_le_bytes());
        out.extend_from_slice(&(shard.index.samples.len() as u32).to_le_bytes());
        for (position, sample) in shard.index.samples.iter().enumerate() {
            out.extend_from_slice(&sample.data_offset.to_le_bytes());
            out.extend_from_slice(&sample.size.to_le_bytes());
            out.extend_from_slice(&sample.label.to_le_bytes());
            put_str(&mut out, shard.index.member_name(position).as_bytes())?;
        }
    }
    if out.len() > max_bytes {
        return Err(Error::TarSet(TarSetError::TarIndexTooLarge {
            samples: shards.iter().map(|s| s.index.samples.len() as u64).sum(),
            bytes: out.len() as u64,
            limit: max_bytes as u64,
        }));
    }
    zstd::bulk::compress(&out, 3).map_err(|source| Error::io("tar index", source))
}

/// Reads what [`encode`] wrote, at most `max_bytes` once decompressed; `uri` names it in
/// errors.
pub(crate) fn decode(bytes: &[u8], uri: &str, max_bytes: usize) -> Result<Vec<IndexedShard>> {
    let bad = |reason: &str| Error::BadTarIndex {
        uri: uri.to_string(),
        reason: reason.to_string(),
    };
    // Streamed, so memory grows with what the index holds: `bulk::decompress` reserves the
    // whole bound up front (1 GiB), which a strict overcommit or an address-space limit refuses
    // by aborting the process.
    let mut raw = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .and_then(|decoder| decoder.take(max_bytes as u64 + 1).read_to_end(&mut raw))
        .map_err(|e| bad(&format!("not zstd: {e}")))?;
    if raw.len() > max_bytes {
        return Err(bad(&format!(
            "larger than {max_bytes} bytes once decompressed"
        )));
    }
    let mut reader = Reader { bytes: &raw, at: 0 };
    let magic = reader.take(MAGIC.len()).map_err(|_| bad("too short"))?;
    if magic != MAGIC {
        return Err(bad(if magic.starts_with(EARLIER_MAGIC) {
            "written under earlier indexing rules (run `stoker index` to write it again)"
        } else {
            "not a Stoker tar index"
        }));
    }
    let cut = |_| bad("cut short");
    let count = reader.u32().map_err(cut)?;
    let mut shards = Vec::new();
    for _ in 0..count {
        let name = reader.string().map_err(cut)?;
        let size = reader.u64().map_err(cut)?;
        let e_tag = reader.string().map_err(cut)?;
        let problems = reader.u64().map_err(cut)?;
        let samples = reader.u32().map_err(cut)?;
        let mut index = ShardIndex {
            problems,
            ..ShardIndex::default()
        };
        for _ in 0..samples {
            let data_offset = reader.u64().map_err(cut)?;
            let sample_size = reader.u64().map_err(cut)?;
            // A label past i64's range reads as negative: refused, as a shard's scan refuses
            // a negative label.
            let label = i64::try_from(reader.u64().map_err(cut)?)
                .map_err(|_| bad(&format!("a sample of {name} has a negative label")))?;
            let member = reader.string().map_err(cut)?;
            // A member the scan found cut short by the shard's end is kept, as the scan keeps
            // it: its read reports the truncation (checked before anything is allocated), and
            // the bad-sample policy applies.
            if data_offset.checked_add(sample_size).is_none() {
                return Err(bad(&format!("a sample of {name} lies past any end")));
            }
            index.push(
                &member,
                IndexedSample {
                    data_offset,
                    size: sample_size,
                    label,
                },
            );
        }
        shards.push(IndexedShard {
            name,
            size,
            e_tag: (!e_tag.is_empty()).then_some(e_tag),
            index,
        });
    }
    if reader.at != raw.len() {
        return Err(bad("bytes after the last shard"));
    }
    Ok(shards)
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, count: usize) -> std::result::Result<&'a [u8], ()> {
        let end = self.at.checked_add(count).ok_or(())?;
        let slice = self.bytes.get(self.at..end).ok_or(())?;
        self.at = end;
        Ok(slice)
    }

    fn u16(&mut self) -> std::result::Result<u16, ()> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> std::result::Result<u32, ()> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> std::result::Result<u64, ()> {
        let mut word = [0u8; 8];
        word.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(word))
    }

    fn string(&mut self) -> std::result::Result<String, ()> {
        let len = usize::from(self.u16()?);
        Ok(String::from_utf8_lossy(self.take(len)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(name: &str) -> IndexedShard {
        let index = ShardIndex::of(0, &[("a/0.jpg", 512, 1000, 3), ("a/1.jpg", 2560, 1000, 0)]);
        IndexedShard {
            name: name.into(),
            size: 10_000,
            e_tag: Some("\"abc\"".into()),
            index,
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let shards = vec![shard("s0.tar"), shard("s1.tar")];
        let bytes = encode(&shards, 1 << 20).unwrap();
        let back = decode(&bytes, "s3://b/i", 1 << 20).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[1].name, "s1.tar");
        assert_eq!(back[1].e_tag.as_deref(), Some("\"abc\""));
        assert_eq!(back[0].index, shards[0].index);
        assert!(decode(&bytes[..bytes.len() / 2], "u", 1 << 20).is_err());
        assert!(decode(b"not zstd", "u", 1 << 20).is_err());
        // Past the bound once decompressed: refused (read streamed, never reserved whole).
        let bound = zstd::bulk::decompress(&bytes, 1 << 20).unwrap().len() - 1;
        let error = decode(&bytes, "u", bound).unwrap_err().to_string();
        assert!(error.contains("larger than"), "{error}");
        // And never written past it.
        let error = encode(&shards, bound).unwrap_err();
        assert!(
            matches!(error, Error::TarSet(TarSetError::TarIndexTooLarge { samples, .. }) if samples == 2 * shards[0].index.samples.len() as u64),
            "{error}"
        );
        let raw = zstd::bulk::decompress(&bytes, 1 << 20).unwrap();
        for cut in [4, raw.len() - 1] {
            let short = zstd::bulk::compress(&raw[..cut], 3).unwrap();
            assert!(decode(&short, "u", 1 << 20).is_err(), "cut at {cut}");
        }
        // An index of the earlier rules (which took AppleDouble files for members) is not read:
        // the shards are scanned again.
        let mut earlier = raw.clone();
        earlier[..8].copy_from_slice(b"STKTIDX2");
        let earlier = zstd::bulk::compress(&earlier, 3).unwrap();
        let error = decode(&earlier, "u", 1 << 20).unwrap_err().to_string();
        assert!(error.contains("earlier indexing rules"), "{error}");
        // A member cut short by its shard's end, as a scan keeps it, reads back (before, the
        // index was refused and every open scanned the whole set again); one whose end
        // overflows is damage.
        let mut past = shard("p.tar");
        past.size = 3000;
        let bytes = encode(std::slice::from_ref(&past), 1 << 20).unwrap();
        assert_eq!(decode(&bytes, "u", 1 << 20).unwrap()[0].index, past.index);
        past.index = ShardIndex::of(0, &[("a/0.jpg", u64::MAX - 10, 1000, 3)]);
        let bytes = encode(&[past], 1 << 20).unwrap();
        let error = decode(&bytes, "u", 1 << 20).unwrap_err().to_string();
        assert!(error.contains("past any end"), "{error}");
        // A negative label (no scan writes one) is refused: the set was served with label -1.
        let mut negative = shard("n.tar");
        negative.index = ShardIndex::of(0, &[("a/0.jpg", 512, 1000, -1)]);
        let bytes = encode(&[negative], 1 << 20).unwrap();
        let error = decode(&bytes, "u", 1 << 20).unwrap_err().to_string();
        assert!(error.contains("negative label"), "{error}");
    }
}
