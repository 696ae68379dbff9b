//! Builds one shard's sample index by walking its tar headers.
//!
//! Image data is never read: the walk seeks from header to header. Only label members (`.cls`,
//! `.json`, a few bytes each) are read, since the label is part of the index. Members are grouped
//! into samples by key, WebDataset style: consecutive members whose paths agree up to the first
//! dot of the file name form one sample.
//!
//! Bad input never aborts the walk: a corrupt header ends the shard's index (nothing after it
//! can be located reliably), incomplete samples are left out, a member cut short by the end of
//! the file is kept (so that reading it reports the truncation against the sample). Each problem
//! is counted and logged, the first few individually.
//!
//! Long member names (a GNU long-name member, a PAX `path` record before the member) are read
//! here, at most [`MAX_EXTENSION_BYTES`] each: the tar crate, left to them, reads whatever size
//! such a header claims into memory, so one crafted header in a large shard could take
//! gigabytes. A larger one ends the shard's index as a corrupt header does.

use std::borrow::Cow;
use std::fs::File;
use std::io::Read;
use std::path::Path;

use tracing::warn;

use crate::error::{Error, Result};

/// Label members larger than this are not labels; they are reported and ignored.
const MAX_LABEL_BYTES: u64 = 64 * 1024;

/// The most bytes of a long-name or PAX member read (a path is at most a few KiB).
const MAX_EXTENSION_BYTES: u64 = 64 * 1024;

/// Problems logged one by one per shard; the rest are summed up in one line.
const PROBLEMS_LOGGED: u64 = 10;

/// One sample of a shard: where its image member's data lies and its label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexedSample {
    /// Byte offset of the image data in the shard file.
    pub(crate) data_offset: u64,
    /// Size of the image data in bytes.
    pub(crate) size: u64,
    /// The class label.
    pub(crate) label: i64,
}

/// The samples of one shard, in tar order, with their image member names.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ShardIndex {
    pub(crate) samples: Vec<IndexedSample>,
    /// The image member names, concatenated.
    pub(crate) names: Vec<u8>,
    /// End offset in `names` of each sample's member name.
    pub(crate) name_ends: Vec<u64>,
    /// Members or samples that were reported while indexing (left out or truncated).
    pub(crate) problems: u64,
}

impl ShardIndex {
    /// The image member name of sample `position` (lossy for non-UTF-8 names).
    pub(crate) fn member_name(&self, position: usize) -> Cow<'_, str> {
        let end = self
            .name_ends
            .get(position)
            .and_then(|end| usize::try_from(*end).ok());
        let start = match position {
            0 => Some(0),
            _ => self
                .name_ends
                .get(position - 1)
                .and_then(|start| usize::try_from(*start).ok()),
        };
        match (start, end) {
            (Some(start), Some(end)) if start <= end && end <= self.names.len() => {
                String::from_utf8_lossy(&self.names[start..end])
            }
            _ => Cow::Borrowed("<unknown member>"),
        }
    }

    /// Appends a sample whose member is `name`.
    pub(crate) fn push(&mut self, name: &str, sample: IndexedSample) {
        self.names.extend_from_slice(name.as_bytes());
        self.name_ends.push(self.names.len() as u64);
        self.samples.push(sample);
    }

    /// An index of `members` (name, data offset, size, label), with `problems` counted: what
    /// the tests and the fuzz seeds write by hand.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn of(problems: u64, members: &[(&str, u64, u64, i64)]) -> ShardIndex {
        let mut index = ShardIndex {
            problems,
            ..ShardIndex::default()
        };
        for &(name, data_offset, size, label) in members {
            index.push(
                name,
                IndexedSample {
                    data_offset,
                    size,
                    label,
                },
            );
        }
        index
    }
}

/// What a member contributes to its sample, by extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MemberKind {
    Image,
    ClassLabel,
    JsonLabel,
    Other,
}

/// Splits a member path into its sample key and lowercased extension: `dir/0001.jpg` gives
/// `("dir/0001", "jpg")`. The extension is everything after the first dot of the file name
/// (`0001.seg.png` has extension `seg.png`). `None` when the file name has no dot, or starts
/// with one: a hidden file, or the AppleDouble `._0001.jpg` macOS's tar writes beside each
/// file with extended attributes, is no sample's member (WebDataset skips them alike).
pub(super) fn split_key(name: &str) -> Option<(&str, String)> {
    let file_start = name.rfind('/').map_or(0, |slash| slash + 1);
    let dot = file_start + name[file_start..].find('.')?;
    if dot == file_start {
        return None;
    }
    Some((&name[..dot], name[dot + 1..].to_ascii_lowercase()))
}

fn member_kind(extension: &str) -> MemberKind {
    match extension {
        "jpg" | "jpeg" | "png" | "webp" | "bmp" | "tif" | "tiff" | "gif" | "pbm" | "pgm"
        | "ppm" | "pnm" => MemberKind::Image,
        "cls" => MemberKind::ClassLabel,
        "json" => MemberKind::JsonLabel,
        _ => MemberKind::Other,
    }
}

/// Parses a `.cls` member: an ASCII integer, surrounding whitespace allowed.
pub(super) fn parse_class_label(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Whether a `.json` member is an object with a `label` or `cls` field (of any value): one
/// without is a sample's metadata.
fn json_names_a_label(bytes: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|value| {
            let object = value.as_object()?;
            Some(object.contains_key("label") || object.contains_key("cls"))
        })
        .unwrap_or(true)
}

/// Parses a `.json` member: an object with an integer `label` (or else `cls`) field; a
/// `label` that is no integer (a class's name) leaves an integer `cls` the label.
pub(super) fn parse_json_label(bytes: &[u8]) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(bytes).ok()?;
    let object = value.as_object()?;
    ["label", "cls"]
        .iter()
        .find_map(|key| object.get(*key).and_then(serde_json::Value::as_i64))
}

/// The image member of the sample being gathered.
struct ImageMember {
    name: String,
    data_offset: u64,
    size: u64,
}

/// Members gathered for the current key.
#[derive(Default)]
struct PendingSample {
    key: String,
    image: Option<ImageMember>,
    /// The label and the member it came from.
    label: Option<(i64, String)>,
    /// Whether `label` came from a `.cls` member (preferred over `.json`).
    label_from_cls: bool,
    /// A label member that could not be used (already reported).
    bad_label: bool,
    /// Whether the pending sample holds any member.
    started: bool,
    /// A member whose extension ends as an image's but starts with more of the file name
    /// (`img_1.5x.jpg`: key `img_1`, extension `5x.jpg`): the image of no sample.
    dotted_image: Option<String>,
    /// A `.json` member without a `label` or `cls` field (metadata).
    unlabelled_json: Option<String>,
    /// A `.json` member whose `label` or `cls` is no non-negative integer (a class name, as
    /// some writers keep beside a `.cls`): a problem only if no `.cls` gives the label.
    unusable_json: Option<String>,
}

/// Accumulates one shard's index and reports problems against the shard.
struct IndexBuilder<'a> {
    shard: &'a Path,
    shard_len: u64,
    index: ShardIndex,
    pending: PendingSample,
}

impl<'a> IndexBuilder<'a> {
    fn problem(&mut self, member: &str, what: &str) {
        self.index.problems += 1;
        if self.index.problems <= PROBLEMS_LOGGED {
            warn!(shard = %self.shard.display(), member, problem = what, "tar shard problem");
        }
    }

    fn member(&mut self, key: &str) {
        if self.pending.started && self.pending.key != key {
            self.finish_sample();
        }
        if !self.pending.started {
            self.pending.key = key.to_string();
            self.pending.started = true;
        }
    }

    fn finish_sample(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        match (pending.image, pending.label) {
            (Some(image), Some((label, _))) => {
                let sample = IndexedSample {
                    data_offset: image.data_offset,
                    size: image.size,
                    label,
                };
                self.index.push(&image.name, sample);
            }
            (Some(image), None) => match (pending.bad_label, pending.unlabelled_json) {
                (true, _) => {}
                (false, _) if pending.unusable_json.is_some() => self.problem(
                    &pending.unusable_json.unwrap_or_default(),
                    "label member is not a non-negative integer label",
                ),
                (false, Some(json)) => self.problem(
                    &json,
                    "image whose .json member holds no label or cls field, and no .cls member",
                ),
                (false, None) => {
                    self.problem(&image.name, "image without a .cls or .json label member")
                }
            },
            (None, _) if pending.dotted_image.is_some() => {
                let member = pending.dotted_image.unwrap_or_default();
                self.problem(
                    &member,
                    "image whose file name holds a dot before its extension: keys end at the \
                     first dot of the file name (as WebDataset reads them), so this is no \
                     sample's image; name it without the dot",
                );
            }
            (None, Some((_, label_member))) => {
                self.problem(&label_member, "label without an image member");
            }
            (None, None) => {}
        }
    }

    fn image(&mut self, name: String, data_offset: u64, size: u64) {
        if self.pending.image.is_some() {
            self.problem(&name, "second image member for the same key; ignored");
            return;
        }
        if data_offset.saturating_add(size) > self.shard_len {
            // Kept: reading the sample reports the truncation, and the bad-sample policy applies.
            self.problem(
                &name,
                "member data runs past the end of the shard (truncated)",
            );
        }
        self.pending.image = Some(ImageMember {
            name,
            data_offset,
            size,
        });
    }

    fn label(&mut self, name: String, label: Option<i64>, from_cls: bool) {
        let Some(label) = label.filter(|label| *label >= 0) else {
            self.pending.bad_label = true;
            self.problem(&name, "label member is not a non-negative integer label");
            return;
        };
        let replace = match self.pending.label {
            None => true,
            // A `.cls` label wins over a `.json` one.
            Some(_) => from_cls && !self.pending.label_from_cls,
        };
        if replace {
            self.pending.label = Some((label, name));
            self.pending.label_from_cls = from_cls;
        }
    }

    fn finish(mut self) -> ShardIndex {
        self.finish_sample();
        if self.index.problems > PROBLEMS_LOGGED {
            warn!(
                shard = %self.shard.display(),
                problems = self.index.problems,
                "tar shard has more problems than were logged one by one"
            );
        }
        self.index.samples.shrink_to_fit();
        self.index.names.shrink_to_fit();
        self.index.name_ends.shrink_to_fit();
        self.index
    }
}

/// What a GNU long-name member (the next member's name) or a PAX member (its `path` and `size`
/// records) says of the next member, read within [`MAX_EXTENSION_BYTES`]; what is wrong
/// otherwise.
type Extension = (Option<Vec<u8>>, Option<u64>);

fn read_extension<R: Read>(
    entry: &mut tar::Entry<'_, R>,
) -> std::result::Result<Extension, String> {
    let size = entry.size();
    if size > MAX_EXTENSION_BYTES {
        return Err(format!(
            "a {size}-byte long-name or PAX header after this member (at most {MAX_EXTENSION_BYTES} \
             are read); the rest of the shard is not indexed"
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut bytes).map_err(|source| {
        format!("a long-name or PAX header after this member is cut short ({source}); the rest of the shard is not indexed")
    })?;
    if entry.header().entry_type().is_gnu_longname() {
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        return Ok((Some(bytes), None));
    }
    let malformed = |what: &dyn std::fmt::Display| {
        format!("a PAX header after this member is malformed ({what}); the rest of the shard is not indexed")
    };
    let (mut path, mut member_size) = (None, None);
    for record in tar::PaxExtensions::new(&bytes) {
        let record = record.map_err(|source| malformed(&source))?;
        match record.key_bytes() {
            b"path" => path = Some(record.value_bytes().to_vec()),
            b"size" => {
                let value = std::str::from_utf8(record.value_bytes())
                    .ok()
                    .and_then(|text| text.trim().parse::<u64>().ok())
                    .ok_or_else(|| malformed(&"its size record is not a number"))?;
                member_size = Some(value);
            }
            _ => {}
        }
    }
    Ok((path, member_size))
}

/// Indexes the shard at `shard`, whose file is `shard_len` bytes long.
///
/// Fails only when the shard cannot be opened; problems inside it are reported and counted.
pub(super) fn scan_shard(shard: &Path, shard_len: u64) -> Result<ShardIndex> {
    let file = File::open(shard).map_err(|source| Error::io(shard, source))?;
    scan_archive(shard, &file, shard_len)
}

/// Indexes the tar bytes `reader` gives, `shard_len` of them; `shard` names it in messages.
pub(crate) fn scan_archive<R: std::io::Read + std::io::Seek>(
    shard: &Path,
    mut reader: R,
    shard_len: u64,
) -> Result<ShardIndex> {
    let mut builder = IndexBuilder {
        shard,
        shard_len,
        index: ShardIndex::default(),
        pending: PendingSample::default(),
    };
    let mut last_member = String::from("<start of shard>");
    // What extension members said of the next member: its name, and its size (a PAX `size`
    // record, for a member of 8 GiB or more, whose header says 0).
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax_size: Option<u64> = None;
    // Where the walk starts: past a member whose size is not its header's, the walk starts
    // again (the tar crate's raw walk steps by the header's size).
    let mut base = 0u64;
    'walk: loop {
        reader
            .seek(std::io::SeekFrom::Start(base))
            .map_err(|source| Error::io(shard, source))?;
        // The tar crate takes the positions its seeks return for its own, from 0.
        let mut archive = tar::Archive::new(FromBase {
            inner: &mut reader,
            base,
        });
        // Raw: the extension members that name the next member come as members, read below.
        let entries = archive
            .entries_with_seek()
            .map_err(|source| Error::io(shard, source))?
            .raw(true);
        for entry in entries {
            let mut entry = match entry {
                Ok(entry) => entry,
                Err(source) => {
                    let what = format!("corrupt or cut tar header after this member ({source}); the rest of the shard is not indexed");
                    builder.problem(&last_member, &what);
                    break 'walk;
                }
            };
            let entry_type = entry.header().entry_type();
            if entry_type.is_gnu_longname() || entry_type.is_pax_local_extensions() {
                match read_extension(&mut entry) {
                    Ok((name, size)) => {
                        long_name = name.or(long_name);
                        pax_size = size.or(pax_size);
                    }
                    Err(what) => {
                        builder.problem(&last_member, &what);
                        break 'walk;
                    }
                }
                continue;
            }
            if entry_type.is_gnu_sparse() {
                let what = "a GNU sparse member after this member (sparse files are not read); the rest of the shard is not indexed";
                builder.problem(&last_member, what);
                break 'walk;
            }
            if entry_type.is_gnu_longlink() || entry_type.is_pax_global_extensions() {
                continue; // its data is skipped, never read
            }
            let name_bytes = match long_name.take() {
                Some(name) => name,
                None => entry.path_bytes().into_owned(),
            };
            let name = String::from_utf8_lossy(&name_bytes).into_owned();
            let data_offset = base.saturating_add(entry.raw_file_position());
            let header_size = entry.size();
            let size = pax_size.take().unwrap_or(header_size);
            if entry_type.is_file() {
                index_member(&mut builder, &mut entry, &name, data_offset, size);
            }
            last_member = name;
            if size != header_size {
                base = data_offset.saturating_add(size.div_ceil(512).saturating_mul(512));
                continue 'walk;
            }
        }
        break;
    }
    Ok(builder.finish())
}

/// A reader whose positions count from `base` of `inner` (already there).
struct FromBase<R> {
    inner: R,
    base: u64,
}

impl<R: Read> Read for FromBase<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.inner.read(buf)
    }
}

impl<R: std::io::Seek> std::io::Seek for FromBase<R> {
    fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
        let to = match to {
            std::io::SeekFrom::Start(at) => std::io::SeekFrom::Start(self.base.saturating_add(at)),
            relative => relative,
        };
        let at = self.inner.seek(to)?;
        at.checked_sub(self.base)
            .ok_or_else(|| std::io::Error::other("seek before the start of the walk"))
    }
}

/// Adds member `name` (a file), whose data is `size` bytes at `data_offset`, to the index: an
/// image's place, or a label read now.
fn index_member<R: Read>(
    builder: &mut IndexBuilder<'_>,
    entry: &mut tar::Entry<'_, R>,
    name: &str,
    data_offset: u64,
    size: u64,
) {
    let Some((key, extension)) = split_key(name) else {
        return;
    };
    let kind = member_kind(&extension);
    if kind == MemberKind::Other {
        // `img_1.5x.jpg`: told of once its sample ends without an image (beside `x.jpg`, an
        // `x.seg.png` is a member of its own kind, not a problem).
        let last = extension.rsplit('.').next().unwrap_or_default();
        if member_kind(last) == MemberKind::Image {
            builder.member(key);
            builder
                .pending
                .dotted_image
                .get_or_insert_with(|| name.to_string());
        }
        return;
    }
    builder.member(key);
    match kind {
        MemberKind::Image => builder.image(name.to_string(), data_offset, size),
        MemberKind::ClassLabel | MemberKind::JsonLabel => {
            if data_offset.saturating_add(size) > builder.shard_len {
                builder.pending.bad_label = true;
                builder.problem(name, "label member runs past the end of the shard");
                return;
            }
            if size > MAX_LABEL_BYTES {
                builder.pending.bad_label = true;
                builder.problem(name, "label member is too large to be a label");
                return;
            }
            let mut bytes = Vec::new();
            if let Err(source) = entry.read_to_end(&mut bytes) {
                builder.pending.bad_label = true;
                builder.problem(name, &format!("cannot read label member: {source}"));
                return;
            }
            let from_cls = kind == MemberKind::ClassLabel;
            if !from_cls && !json_names_a_label(&bytes) {
                // A sample's metadata (`.json` without `label` or `cls`), not its label: a
                // problem only if no `.cls` gives one.
                builder
                    .pending
                    .unlabelled_json
                    .get_or_insert_with(|| name.to_string());
                return;
            }
            let label = if from_cls {
                parse_class_label(&bytes)
            } else {
                parse_json_label(&bytes)
            };
            if !from_cls && label.is_none_or(|label| label < 0) {
                builder
                    .pending
                    .unusable_json
                    .get_or_insert_with(|| name.to_string());
                return;
            }
            builder.label(name.to_string(), label, from_cls);
        }
        MemberKind::Other => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reader that counts the bytes read through it.
    struct Counting<R> {
        inner: R,
        read: std::rc::Rc<std::cell::Cell<u64>>,
    }

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.inner.read(buf)?;
            self.read.set(self.read.get() + n as u64);
            Ok(n)
        }
    }

    impl<R: std::io::Seek> std::io::Seek for Counting<R> {
        fn seek(&mut self, to: std::io::SeekFrom) -> std::io::Result<u64> {
            self.inner.seek(to)
        }
    }

    /// A tar of `members` (name, bytes), long names as the tar crate writes them (GNU).
    fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, bytes) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            builder
                .append_data(&mut header, name, *bytes)
                .expect("a member");
        }
        builder.into_inner().expect("a tar")
    }

    fn scan(bytes: &[u8]) -> (ShardIndex, u64) {
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let reader = Counting {
            inner: std::io::Cursor::new(bytes),
            read: std::rc::Rc::clone(&read),
        };
        let index =
            scan_archive(Path::new("shard.tar"), reader, bytes.len() as u64).expect("an index");
        (index, read.get())
    }

    #[test]
    fn long_member_names_are_read_from_their_gnu_and_pax_headers() {
        let long = format!("{}/0001.jpg", "d".repeat(150));
        let long_cls = format!("{}/0001.cls", "d".repeat(150));
        let gnu = tar_of(&[(&long, b"jpeg"), (&long_cls, b"3")]);
        let (index, _) = scan(&gnu);
        assert_eq!(index.problems, 0);
        assert_eq!(index.member_name(0), long.as_str());
        assert_eq!(index.samples[0].label, 3);
        // The same names in PAX records before plain headers.
        let mut pax = Vec::new();
        for (name, bytes) in [(&long, &b"jpeg"[..]), (&long_cls, &b"3"[..])] {
            pax.extend(pax_member(&[("path", name)]));
            pax.extend(ustar_member("short", bytes.len() as u64, bytes));
        }
        pax.extend_from_slice(&[0; 1024]);
        let (index, _) = scan(&pax);
        assert_eq!(index.problems, 0);
        assert_eq!(index.member_name(0), long.as_str());
        assert_eq!(index.samples[0].label, 3);
    }

    /// A PAX member whose records are `records` (key, value).
    fn pax_member(records: &[(&str, &str)]) -> Vec<u8> {
        let mut data = String::new();
        for (key, value) in records {
            // "<length> key=value\n", the length counting its own digits.
            let body = format!(" {key}={value}\n");
            let mut length = body.len() + 1;
            while format!("{length}").len() + body.len() != length {
                length += 1;
            }
            data.push_str(&format!("{length}{body}"));
        }
        let mut header = tar::Header::new_ustar();
        header.set_entry_type(tar::EntryType::XHeader);
        header.set_size(data.len() as u64);
        header.set_path("PaxHeader").expect("a short name");
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data.as_bytes());
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    /// A ustar member `name` whose header says `header_size` bytes, `data` after it, padded.
    fn ustar_member(name: &str, header_size: u64, data: &[u8]) -> Vec<u8> {
        let mut header = tar::Header::new_ustar();
        header.set_size(header_size);
        header.set_mode(0o644);
        header.set_path(name).expect("a short name");
        header.set_cksum();
        let mut out = header.as_bytes().to_vec();
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
        out
    }

    #[test]
    fn a_pax_size_record_places_its_member_and_the_walk_goes_on_after_it() {
        // As a writer puts a member of 8 GiB or more: its size in a PAX record, 0 in its
        // header (here 1,000 bytes, so the test stays small).
        let mut bytes = tar_of(&[("0000.jpg", b"jpeg"), ("0000.cls", b"1")]);
        bytes.truncate(bytes.len() - 1024);
        bytes.extend_from_slice(&pax_member(&[("size", "1000"), ("path", "0001.jpg")]));
        let data_offset = bytes.len() as u64 + 512;
        bytes.extend(ustar_member("0001.jpg", 0, &[b'j'; 1000]));
        bytes.extend_from_slice(&tar_of(&[
            ("0001.cls", b"2"),
            ("0002.jpg", b"jpeg"),
            ("0002.cls", b"3"),
        ]));
        let (index, _) = scan(&bytes);
        assert_eq!(index.problems, 0);
        assert_eq!(index.samples.len(), 3);
        assert_eq!(index.member_name(1), "0001.jpg");
        assert_eq!(
            (index.samples[1].data_offset, index.samples[1].size),
            (data_offset, 1000)
        );
        assert_eq!(index.samples[1].label, 2);
        assert_eq!(index.samples[2].label, 3);
    }

    #[test]
    fn a_long_name_header_claiming_megabytes_is_not_read_into_memory() {
        // A GNU long-name header claiming 8 MiB, then 8 MiB of filler and a member.
        let claimed = 8 << 20;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::GNULongName);
        header.set_size(claimed);
        header
            .set_path("././@LongLink")
            .expect("the long-link name");
        header.set_cksum();
        let mut bytes = tar_of(&[("0000.jpg", b"jpeg"), ("0000.cls", b"1")]);
        bytes.truncate(bytes.len() - 1024); // without the end-of-archive blocks
        bytes.extend_from_slice(header.as_bytes());
        bytes.resize(bytes.len() + claimed as usize, b'x');
        bytes.extend_from_slice(&tar_of(&[("0001.jpg", b"jpeg"), ("0001.cls", b"2")]));
        let (index, read) = scan(&bytes);
        assert_eq!(index.samples.len(), 1, "the sample before it is kept");
        assert_eq!(index.problems, 1);
        assert!(read < 1 << 20, "{read} bytes read for an 8 MiB long name");
    }

    #[test]
    fn keys_stop_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_key("dir/0001.jpg"), Some(("dir/0001", "jpg".into())));
        assert_eq!(
            split_key("a.b/0001.JPEG"),
            Some(("a.b/0001", "jpeg".into()))
        );
        assert_eq!(
            split_key("0001.seg.png"),
            Some(("0001", "seg.png".to_string()))
        );
        assert_eq!(split_key("dir/README"), None);
        assert_eq!(split_key("dir/._0001.jpg"), None);
        assert_eq!(split_key(".hidden.jpg"), None);
    }

    /// A `.json` naming its class by name beside the `.cls` that gives the label: the sample is
    /// read with the `.cls` label and no problem (every sample was one); alone, it is one.
    #[test]
    fn an_unusable_json_label_beside_a_cls_is_no_problem() {
        let bytes = tar_of(&[
            ("0001.cls", b"3"),
            ("0001.json", br#"{"label": "tench"}"#),
            ("0001.jpg", b"jpeg"),
            ("0002.json", br#"{"label": "tench"}"#),
            ("0002.jpg", b"jpeg"),
        ]);
        let (index, _) = scan(&bytes);
        assert_eq!(index.samples.len(), 1);
        assert_eq!(index.samples[0].label, 3);
        assert_eq!(index.problems, 1, "the sample with no usable label");
    }

    /// A shard written by macOS's tar over files with extended attributes: an AppleDouble
    /// `._` member before each file. Every sample is read, with no problem told (each `._`
    /// member ended the sample before it, the label's and the image's apart).
    #[test]
    fn macos_apple_double_members_are_no_samples_members() {
        let bytes = tar_of(&[
            ("._0001.cls", b"attrs"),
            ("0001.cls", b"3"),
            ("._0001.jpg", b"attrs"),
            ("0001.jpg", b"jpeg"),
            ("._0002.cls", b"attrs"),
            ("0002.cls", b"4"),
            ("._0002.jpg", b"attrs"),
            ("0002.jpg", b"jpeg"),
        ]);
        let (index, _) = scan(&bytes);
        assert_eq!(index.problems, 0);
        assert_eq!(index.samples.len(), 2);
        assert_eq!((index.samples[0].label, index.samples[1].label), (3, 4));
    }

    #[test]
    fn labels_parse_from_cls_and_json() {
        assert_eq!(parse_class_label(b" 7\n"), Some(7));
        assert_eq!(parse_class_label(b"seven"), None);
        assert_eq!(parse_json_label(br#"{"label": 3}"#), Some(3));
        assert_eq!(parse_json_label(br#"{"cls": 4, "x": 1}"#), Some(4));
        assert_eq!(parse_json_label(br#"{"label": "3"}"#), None);
        // A class's name as `label`, its number as `cls`: the number.
        assert_eq!(
            parse_json_label(br#"{"label": "tench", "cls": 0}"#),
            Some(0)
        );
        assert_eq!(parse_json_label(br#"{"label": 2, "cls": 5}"#), Some(2));
        assert_eq!(parse_json_label(b"[3]"), None);
    }

    #[test]
    fn member_names_are_found_by_position() {
        let mut index = ShardIndex::default();
        let sample = IndexedSample {
            data_offset: 512,
            size: 3,
            label: 1,
        };
        index.push("a.jpg", sample);
        index.push("bb.png", sample);
        assert_eq!(index.member_name(0), "a.jpg");
        assert_eq!(index.member_name(1), "bb.png");
        assert_eq!(index.member_name(2), "<unknown member>");
    }
}
