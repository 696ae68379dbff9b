//! One Arrow IPC *stream* file, the format `Dataset.save_to_disk` writes its `.arrow` shards in.
//!
//! A stream has no footer, so opening walks its messages from the start: each message is a
//! length-prefixed flatbuffer header (verified by `arrow_ipc::root_as_message`) followed by a
//! body whose length the header gives. Only the headers are read; bodies are skipped by
//! offset. The walk records each record batch's header, body position and row count, and must
//! end at the end-of-stream marker: a file cut short anywhere (even between two batches) is an
//! error naming it.
//!
//! Reading columns of one batch reads, with positioned reads (`read_exact_at`, no memory map:
//! a file truncated later is an I/O error, never a `SIGBUS`), only the byte ranges of those
//! columns' buffers, into a zeroed body of the batch's layout, and lets arrow-ipc decode them
//! with a projection: the other columns' buffers are skipped by the decoder and never read,
//! so the label column of an image dataset is read at open without touching its images.
//!
//! The file is read through the process's bounded pool of open files (`file_pool.rs`): the
//! descriptor the walk opened goes into the pool, so a folder of more shards than the pool's
//! budget opens and reads under a small descriptor limit. A shard the pool let go is opened
//! again by its path and must be the file walked at open (`same_file.rs`). A shard fetched
//! from a store lets go of its copy's lock in the cache once walked (a descriptor a shard would
//! keep a folder of more shards than the descriptor limit from opening): the copy, evicted
//! since, is fetched again as the pool opens it again, and must have its length at open.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_buffer::{Buffer, MutableBuffer};
use arrow_ipc::{MessageHeader, MetadataVersion};
use arrow_schema::{DataType, SchemaRef, UnionMode};

use crate::decoder_panics::without_panics;
use crate::error::{Error, Result};
use crate::file_pool::{failed_for_descriptors, FileKey, FilePool, PooledFile};
use crate::same_file::SameFile;
use crate::storage::{self, CachedObject, Remake};

/// The marker before each message's header length (since Arrow 0.15).
const CONTINUATION_MARKER: [u8; 4] = [0xff; 4];

/// One record batch of a stream file, located by its header.
pub(super) struct BatchBlock {
    /// The message's flatbuffer header (a `Message` holding a `RecordBatch`).
    header: Vec<u8>,
    /// Where the batch's body starts in the file.
    body_offset: u64,
    /// The body's length in bytes.
    body_len: u64,
    /// Rows in the batch.
    pub(super) rows: u64,
}

/// An opened stream file: its schema and record batches.
pub(super) struct StreamFile {
    pub(super) path: PathBuf,
    /// The file read: `path`, or the copy of an object in the cache tier.
    read_from: PathBuf,
    /// File size in bytes.
    pub(super) bytes: u64,
    /// The pool of open files it is read through (the process's), and its key there.
    pool: &'static FilePool,
    pool_key: FileKey,
    /// The file as opened: each read refuses it cut, grown, or another file in its place.
    same: SameFile,
    pub(super) schema: SchemaRef,
    pub(super) batches: Vec<BatchBlock>,
    /// The copy in the cache tier read for an object of a store, let go of once walked.
    _copy: Option<CachedObject>,
    /// How that copy is fetched again once evicted.
    remake: Option<Remake>,
}

fn stream_error(path: &Path, problem: impl Into<String>) -> Error {
    Error::ArrowStream {
        path: path.to_path_buf(),
        problem: problem.into(),
    }
}

/// Reads `buf.len()` bytes at `offset`; a short file is a truncation error naming it.
fn read_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<()> {
    file.read_exact_at(buf, offset).map_err(|source| {
        if source.kind() == std::io::ErrorKind::UnexpectedEof {
            stream_error(
                path,
                format!(
                    "the file ends before byte {} (it is truncated or was changed since it was \
                     opened)",
                    offset + buf.len() as u64
                ),
            )
        } else {
            Error::io(path, source)
        }
    })
}

/// Converts a header's signed length or offset, refusing negative values.
fn non_negative(value: i64, what: &str, path: &Path) -> Result<u64> {
    u64::try_from(value).map_err(|_| stream_error(path, format!("negative {what} {value}")))
}

impl StreamFile {
    /// Opens `path` and indexes its record batches from the message headers.
    pub(super) fn open(path: PathBuf) -> Result<StreamFile> {
        Self::open_in(path, None, FilePool::global())
    }

    /// Opens the copy `copy` in the cache tier of an object of a store (`path` its URI), as
    /// [`StreamFile::open`] does; its lock is let go of once walked, and `remake` fetches it
    /// again once evicted.
    pub(super) fn open_copy(
        path: PathBuf,
        copy: CachedObject,
        remake: Remake,
    ) -> Result<StreamFile> {
        Self::open_in(path, Some((copy, remake)), FilePool::global())
    }

    /// [`StreamFile::open`] or [`StreamFile::open_copy`], read through `pool`.
    fn open_in(
        path: PathBuf,
        copy: Option<(CachedObject, Remake)>,
        pool: &'static FilePool,
    ) -> Result<StreamFile> {
        let (copy, remake) = copy.unzip();
        let read_from = copy
            .as_ref()
            .map_or_else(|| path.clone(), |copy| copy.path().to_path_buf());
        let file = File::open(&read_from).map_err(|source| Error::io(&path, source))?;
        let same = SameFile::of_file(&file, &path)?;
        let bytes = same.len();
        let truncated = |position: u64, needed: u64| {
            stream_error(
                &path,
                format!(
                    "the file is truncated: the message at byte {position} needs bytes up to \
                     {needed} but the file has {bytes} (a complete stream ends with an \
                     end-of-stream marker)"
                ),
            )
        };
        let mut schema = None;
        let mut batches = Vec::new();
        let mut position = 0u64;
        loop {
            let mut word = [0u8; 4];
            if position + 4 > bytes {
                return Err(truncated(position, position + 4));
            }
            read_at(&file, &path, &mut word, position)?;
            let mut prefix = 4;
            if word == CONTINUATION_MARKER {
                if position + 8 > bytes {
                    return Err(truncated(position, position + 8));
                }
                read_at(&file, &path, &mut word, position + 4)?;
                prefix = 8;
            }
            let header_len = i32::from_le_bytes(word);
            if header_len == 0 {
                break; // The end-of-stream marker.
            }
            let header_len = non_negative(i64::from(header_len), "message length", &path)?;
            let header_end = position + prefix + header_len;
            if header_end > bytes {
                return Err(truncated(position, header_end));
            }
            let mut header = vec![0u8; usize::try_from(header_len).unwrap_or(usize::MAX)];
            read_at(&file, &path, &mut header, position + prefix)?;
            let message = arrow_ipc::root_as_message(&header).map_err(|error| {
                stream_error(
                    &path,
                    format!("the message at byte {position} is not an arrow message: {error}"),
                )
            })?;
            let body_len = non_negative(message.bodyLength(), "body length", &path)?;
            let body_end = header_end.saturating_add(body_len);
            if body_end > bytes {
                return Err(truncated(position, body_end));
            }
            match message.header_type() {
                MessageHeader::Schema => {
                    let fb_schema = message
                        .header_as_schema()
                        .ok_or_else(|| stream_error(&path, "unreadable schema message"))?;
                    if schema.is_some() {
                        return Err(stream_error(&path, "the stream holds a second schema"));
                    }
                    let parsed =
                        without_panics("arrow", || arrow_ipc::convert::fb_to_schema(fb_schema))
                            .map_err(|problem| stream_error(&path, problem))?;
                    schema = Some(Arc::new(parsed));
                }
                MessageHeader::RecordBatch => {
                    let batch = message.header_as_record_batch().ok_or_else(|| {
                        stream_error(&path, format!("unreadable record batch at byte {position}"))
                    })?;
                    if schema.is_none() {
                        return Err(stream_error(
                            &path,
                            "a record batch comes before the schema",
                        ));
                    }
                    if batch.compression().is_some() {
                        return Err(stream_error(
                            &path,
                            "its record batches are compressed (lz4/zstd IPC compression), \
                             which Stoker does not read; save the dataset without compression",
                        ));
                    }
                    let rows = non_negative(batch.length(), "row count", &path)?;
                    // Every row of a column with buffers takes a bit of its body at least (a
                    // validity or boolean bit, an offset, a value): a count past that is the
                    // file's word alone (2^62 rows in a few bytes opened as a set of 2^62
                    // samples). Columns of nulls alone take none.
                    let buffered = schema.as_ref().is_some_and(|schema| {
                        schema
                            .fields()
                            .iter()
                            .any(|field| field.data_type() != &DataType::Null)
                    });
                    if buffered && rows > body_len.saturating_mul(8) {
                        return Err(stream_error(
                            &path,
                            format!(
                                "the record batch at byte {position} claims {rows} rows in a \
                                 body of {body_len} bytes"
                            ),
                        ));
                    }
                    batches.push(BatchBlock {
                        header,
                        body_offset: header_end,
                        body_len,
                        rows,
                    });
                }
                MessageHeader::DictionaryBatch => {
                    return Err(stream_error(
                        &path,
                        "it holds dictionary-encoded columns, which Stoker does not read",
                    ))
                }
                other => {
                    return Err(stream_error(
                        &path,
                        format!("unexpected message {other:?} at byte {position}"),
                    ))
                }
            }
            position = body_end;
        }
        let schema = schema.ok_or_else(|| stream_error(&path, "the stream has no schema"))?;
        let opened = StreamFile {
            path,
            read_from,
            bytes,
            pool,
            pool_key: pool.reserve_keys(1).start,
            same,
            schema,
            batches,
            _copy: copy.map(|mut copy| {
                copy.release_lock();
                copy
            }),
            remake,
        };
        // The descriptor walked goes into the pool: its first read needs no second open.
        let walked = RefCell::new(Some(file));
        opened.pooled(|| walked.borrow_mut().take())?;
        Ok(opened)
    }

    /// The open file from the pool, opened again by its path when the pool let it go (or
    /// taken from `spare` when that has one).
    fn pooled(&self, spare: impl Fn() -> Option<File>) -> Result<Arc<PooledFile>> {
        self.pool.get_or_open(
            self.pool_key,
            || match spare() {
                Some(file) => Ok(PooledFile::plain(file)),
                None => self.open_again().map(PooledFile::plain),
            },
            failed_for_descriptors,
        )
    }

    /// The file opened again by its path; an object's copy evicted since it was walked,
    /// fetched again ([`Remake::open_again`]).
    fn open_again(&self) -> Result<File> {
        storage::open_again(self.remake.as_ref(), &self.path, &self.read_from)
    }

    /// Refuses `file` (opened again by its path) when it is not the file walked at open; an
    /// object's copy fetched again is another file of the same length ([`Remake::check_copy`]).
    fn check_unchanged(&self, file: &File) -> Result<()> {
        match self.remake {
            Some(_) => Remake::check_copy(file, &self.read_from, self.same.len()),
            None => self.same.check(file, &self.path),
        }
    }

    /// Reads and decodes root columns `columns` (schema indices) of batch `batch`, in the
    /// order given.
    pub(super) fn read_columns(&self, batch: usize, columns: &[usize]) -> Result<RecordBatch> {
        let block = self.batches.get(batch).ok_or_else(|| {
            stream_error(&self.path, format!("the file has no record batch {batch}"))
        })?;
        let corrupt = |problem: String| {
            stream_error(
                &self.path,
                format!("record batch {batch} is corrupt: {problem}"),
            )
        };
        let message = arrow_ipc::root_as_message(&block.header)
            .map_err(|error| corrupt(error.to_string()))?;
        let record = message
            .header_as_record_batch()
            .ok_or_else(|| corrupt("not a record batch".into()))?;
        let buffers = record
            .buffers()
            .ok_or_else(|| corrupt("no buffer list".into()))?;
        let version = message.version();
        let mut variadic = record.variadicBufferCounts().into_iter().flatten();

        // The byte range of each wanted column's buffers inside the body.
        let mut spans: Vec<Range<u64>> = Vec::new();
        // The decoder slices every wanted buffer, empty ones too: the body must reach past all.
        let mut body_len = 0u64;
        let mut next_buffer = 0usize;
        for (index, field) in self.schema.fields().iter().enumerate() {
            let count = buffer_count(field.data_type(), &mut variadic, version)
                .map_err(|problem| corrupt(problem.to_string()))?;
            let range = next_buffer..next_buffer + count;
            next_buffer = range.end;
            if !columns.contains(&index) {
                continue;
            }
            let mut span: Option<Range<u64>> = None;
            for position in range {
                if position >= buffers.len() {
                    break; // Reported below, against the whole list.
                }
                let buffer = buffers.get(position);
                let start = non_negative(buffer.offset(), "buffer offset", &self.path)?;
                let length = non_negative(buffer.length(), "buffer length", &self.path)?;
                let end = start.saturating_add(length);
                if end > block.body_len {
                    return Err(corrupt(format!(
                        "a buffer runs to byte {end} of a {}-byte body",
                        block.body_len
                    )));
                }
                body_len = body_len.max(end);
                if length > 0 {
                    span = Some(match span {
                        Some(span) => span.start.min(start)..span.end.max(end),
                        None => start..end,
                    });
                }
            }
            spans.extend(span);
        }
        if next_buffer != buffers.len() {
            return Err(corrupt(format!(
                "it lists {} buffers where the schema needs {next_buffer}",
                buffers.len()
            )));
        }

        let body_len = usize::try_from(body_len)
            .map_err(|_| corrupt(format!("a body of {body_len} bytes does not fit memory")))?;
        // Changed since it was opened (`save_to_disk` again into the same folder, a copy
        // still being written): the job stops naming the file, no row is a bad sample.
        let pooled = self.pooled(|| None)?;
        self.check_unchanged(&pooled.file)?;
        // Zeroed pages cost nothing until written: only the wanted spans are read into it.
        let mut body = MutableBuffer::from_len_zeroed(body_len);
        for span in &spans {
            let (Ok(start), Ok(end)) = (usize::try_from(span.start), usize::try_from(span.end))
            else {
                continue;
            };
            let at = block.body_offset + span.start;
            let into = &mut body.as_slice_mut()[start..end];
            pooled.file.read_exact_at(into, at).map_err(|source| {
                if source.kind() == std::io::ErrorKind::UnexpectedEof {
                    Error::FileChanged {
                        path: self.path.clone(),
                        opened_len: self.bytes,
                        end: at + (end - start) as u64,
                    }
                } else {
                    Error::io(&self.path, source)
                }
            })?;
        }
        let body: Buffer = body.into();
        let dictionaries = HashMap::new();
        without_panics("arrow", || {
            arrow_ipc::reader::read_record_batch(
                &body,
                record,
                Arc::clone(&self.schema),
                &dictionaries,
                Some(columns),
                &version,
            )
        })
        .map_err(corrupt)?
        .map_err(|error| corrupt(error.to_string()))
    }
}

impl Drop for StreamFile {
    fn drop(&mut self) {
        self.pool.forget_one(self.pool_key);
    }
}

/// `a + b`, or why not: buffer counts come from the file (a view column's variadic count is
/// the file's word, up to i64's range), and a sum that wrapped could pass the check that every
/// buffer is accounted for.
fn plus(a: usize, b: usize) -> std::result::Result<usize, &'static str> {
    a.checked_add(b).ok_or("buffer counts past any file's")
}

/// How many IPC buffers a column of `data_type` has (the layout arrow-ipc's reader walks).
fn buffer_count(
    data_type: &DataType,
    variadic: &mut dyn Iterator<Item = i64>,
    version: MetadataVersion,
) -> std::result::Result<usize, &'static str> {
    Ok(match data_type {
        DataType::Null => 0,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => 3,
        DataType::Utf8View | DataType::BinaryView => {
            let extra = variadic
                .next()
                .ok_or("a view column has no variadic buffer count")?;
            plus(
                2,
                usize::try_from(extra).map_err(|_| "negative variadic buffer count")?,
            )?
        }
        DataType::List(child) | DataType::LargeList(child) | DataType::Map(child, _) => {
            plus(2, buffer_count(child.data_type(), variadic, version)?)?
        }
        DataType::ListView(child) | DataType::LargeListView(child) => {
            plus(3, buffer_count(child.data_type(), variadic, version)?)?
        }
        DataType::FixedSizeList(child, _) => {
            plus(1, buffer_count(child.data_type(), variadic, version)?)?
        }
        DataType::Struct(fields) => plus(
            1,
            children_buffer_count(fields.iter().map(|f| f.data_type()), variadic, version)?,
        )?,
        DataType::RunEndEncoded(run_ends, values) => children_buffer_count(
            [run_ends.data_type(), values.data_type()].into_iter(),
            variadic,
            version,
        )?,
        DataType::Union(fields, mode) => {
            let own = usize::from(version < MetadataVersion::V5)
                + 1
                + usize::from(*mode == UnionMode::Dense);
            plus(
                own,
                children_buffer_count(
                    fields.iter().map(|(_, field)| field.data_type()),
                    variadic,
                    version,
                )?,
            )?
        }
        // Validity and values (fixed-width, boolean, fixed-size binary, dictionary keys).
        _ => 2,
    })
}

/// The buffers of a list of child columns.
fn children_buffer_count<'a>(
    children: impl Iterator<Item = &'a DataType>,
    variadic: &mut dyn Iterator<Item = i64>,
    version: MetadataVersion,
) -> std::result::Result<usize, &'static str> {
    let mut total = 0;
    for child in children {
        total = plus(total, buffer_count(child, variadic, version)?)?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use arrow_schema::{Field, Fields};

    use super::*;

    #[test]
    fn buffer_counts_follow_the_ipc_layout() {
        let mut none = std::iter::empty();
        let v5 = MetadataVersion::V5;
        assert_eq!(buffer_count(&DataType::Int64, &mut none, v5), Ok(2));
        assert_eq!(buffer_count(&DataType::LargeUtf8, &mut none, v5), Ok(3));
        let image = DataType::Struct(Fields::from(vec![
            Field::new("bytes", DataType::Binary, true),
            Field::new("path", DataType::Utf8, true),
        ]));
        assert_eq!(buffer_count(&image, &mut none, v5), Ok(7));
        let list = DataType::List(Arc::new(Field::new("item", DataType::Float32, true)));
        assert_eq!(buffer_count(&list, &mut none, v5), Ok(4));
        let mut counts = [3i64].into_iter();
        assert_eq!(buffer_count(&DataType::Utf8View, &mut counts, v5), Ok(5));
        assert!(buffer_count(&DataType::Utf8View, &mut counts, v5).is_err());
        // Two view columns whose variadic counts add up past usize: refused, not wrapped to
        // a small count that the check of every buffer accounted for could pass.
        let two_views = DataType::Struct(Fields::from(vec![
            Field::new("a", DataType::Utf8View, true),
            Field::new("b", DataType::Utf8View, true),
        ]));
        let mut huge = [i64::MAX, i64::MAX, i64::MAX].into_iter();
        assert!(buffer_count(&two_views, &mut huge, v5).is_err());
    }

    /// A stream of `rows` one-byte-string rows written to `path` in one record batch.
    fn write_stream(path: &Path, rows: &[&[u8]]) {
        use arrow_array::BinaryArray;
        let schema = Arc::new(arrow_schema::Schema::new(vec![Field::new(
            "text",
            DataType::Binary,
            false,
        )]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(BinaryArray::from_vec(rows.to_vec()))],
        )
        .unwrap();
        let file = std::fs::File::create(path).unwrap();
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(file, &schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
    }

    /// The descriptor the walk opened is the one read while the pool keeps it (a file renamed
    /// over the shard meanwhile is not read); once the pool let it go, the shard is opened
    /// again by its path and another file there is refused, never read under the old index.
    #[test]
    fn a_shard_is_read_from_the_pool_and_checked_when_opened_again() {
        use arrow_array::cast::AsArray;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data-00000-of-00001.arrow");
        write_stream(&path, &[b"old 1", b"old 2"]);
        // A pool of its own: the process's is shared with the other tests running.
        let pool: &'static FilePool = Box::leak(Box::new(FilePool::with_budget(4)));
        let shard = StreamFile::open_in(path.clone(), None, pool).unwrap();
        assert_eq!(pool.opened(), 1);
        let other = dir.path().join("other.arrow");
        write_stream(&other, &[b"new 1", b"new 2"]);
        std::fs::rename(&other, &path).unwrap();

        let batch = shard.read_columns(0, &[0]).unwrap();
        assert_eq!(batch.column(0).as_binary::<i32>().value(1), b"old 2");
        assert_eq!(
            pool.opened(),
            1,
            "the walk's descriptor was read, not a second one"
        );

        pool.forget_one(shard.pool_key);
        let error = shard.read_columns(0, &[0]).expect_err("refused");
        assert!(
            matches!(error, Error::FileReplaced { .. }) && error.dataset_changed(),
            "{error}"
        );
        // Removed: the dataset changed, not a sample that cannot be read.
        pool.forget_one(shard.pool_key);
        std::fs::remove_file(&path).unwrap();
        let error = shard.read_columns(0, &[0]).expect_err("refused");
        assert!(
            matches!(error, Error::FileRemoved { .. }) && error.dataset_changed(),
            "{error}"
        );
        drop(shard);
        assert_eq!(pool.descriptors(), 0);
    }

    /// A shard of a store let go of its copy's lock once walked (it held one, a descriptor a
    /// shard, from open to drop): the copy, evicted, is fetched again as the pool opens it
    /// again, the same rows; the object rewritten meanwhile (the same length) stops the read,
    /// naming it.
    #[test]
    fn a_fetched_shards_copy_is_let_go_and_fetched_again_once_evicted() {
        use crate::storage::{evict_all, OneObject, Remake};
        use arrow_array::cast::AsArray;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data-00000-of-00001.arrow");
        write_stream(&path, &[b"old 1", b"old 2"]);
        let one = OneObject::new(&std::fs::read(&path).unwrap());
        let pool: &'static FilePool = Box::leak(Box::new(FilePool::with_budget(4)));
        let copy = Remake::Fetched(one.object.clone()).copy().unwrap();
        let uri = PathBuf::from("s3://bucket/set/a.txt");
        let remake = Remake::Fetched(one.object.clone());
        let shard = StreamFile::open_in(uri, Some((copy, remake)), pool).unwrap();
        assert!(!shard._copy.as_ref().unwrap().is_locked());
        let second = |shard: &StreamFile| {
            let batch = shard.read_columns(0, &[0])?;
            Ok::<_, Error>(batch.column(0).as_binary::<i32>().value(1).to_vec())
        };
        assert_eq!(second(&shard).unwrap(), b"old 2");
        pool.forget_one(shard.pool_key);
        evict_all(&one.cache);
        assert!(!shard.read_from.exists(), "evicted");
        assert_eq!(second(&shard).unwrap(), b"old 2");

        write_stream(&path, &[b"new 1", b"new 2"]);
        one.put(&std::fs::read(&path).unwrap());
        pool.forget_one(shard.pool_key);
        evict_all(&one.cache);
        let error = second(&shard).unwrap_err();
        assert!(
            matches!(error, Error::ObjectChanged { .. }) && error.dataset_changed(),
            "{error}"
        );
    }

    /// A record batch claiming more rows than its body can hold is refused: 2^62 rows written
    /// over 12,345 opened as a set of 2^62 samples.
    #[test]
    fn a_batch_claiming_more_rows_than_its_body_holds_is_refused() {
        use arrow_array::{BinaryArray, RecordBatch};
        let schema = Arc::new(arrow_schema::Schema::new(vec![Field::new(
            "text",
            DataType::Binary,
            false,
        )]));
        let rows: Vec<&[u8]> = vec![b"ab"; 12_345];
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![Arc::new(BinaryArray::from_vec(rows))],
        )
        .unwrap();
        let mut bytes = Vec::new();
        let mut writer = arrow_ipc::writer::StreamWriter::try_new(&mut bytes, &schema).unwrap();
        writer.write(&batch).unwrap();
        writer.finish().unwrap();
        drop(writer);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data-00000-of-00001.arrow");
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(
            StreamFile::open(path.clone()).unwrap().batches[0].rows,
            12_345
        );
        // The row counts in the batch's message (the batch's and its column's), patched.
        let count = 12_345i64.to_le_bytes();
        let at: Vec<usize> = (0..bytes.len() - 8)
            .filter(|&i| bytes[i..i + 8] == count)
            .collect();
        assert_eq!(at.len(), 2, "{at:?}");
        for at in at {
            bytes[at..at + 8].copy_from_slice(&(1i64 << 62).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        let error = StreamFile::open(path).err().expect("refused").to_string();
        assert!(error.contains("claims 4611686018427387904 rows"), "{error}");
    }
}
