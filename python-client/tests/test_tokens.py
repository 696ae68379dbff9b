"""Token files and tokenised JSONL text through stoker.Loader: formats by URI or format=,
token ops, zero-copy tensors, every sample once per epoch, determinism, bad lines."""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_zero_copy import buffer_behind

import stoker
from stoker import _native, ops

SEQ_LEN = 32
WORDS = ["stoker", "feeds", "the", "gpu", "with", "tokens", "packed", "into", "rows", "of", "text",
         "documents"]


def document(i: int) -> str:
    return " ".join(WORDS[(i * 31 + w * 17) % len(WORDS)] for w in range(1 + (i * 7919) % 40))


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Token i is i % 65521, so a window's first token names its start; 100 windows + tail."""
    path = tmp_path_factory.mktemp("tokens") / "train.bin"
    (np.arange(100 * SEQ_LEN + 1 + 5) % 65521).astype("<u2").tofile(path)
    return path


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(folder of two JSONL files, 50 documents with line 2 of b.jsonl malformed; tokenizer)."""
    root = tmp_path_factory.mktemp("text")
    folder = root / "docs"
    folder.mkdir()
    lines = [json.dumps({"text": document(i)}) for i in range(50)]
    lines[31] = '{"text": "cut short'
    (folder / "a.jsonl").write_text("\n".join(lines[:30]) + "\n")
    (folder / "b.jsonl").write_text("\n".join(lines[30:]) + "\n")
    tokenizer = root / "tokenizer.json"
    _native.train_bpe_tokenizer([document(i) for i in range(300)], str(tokenizer), vocab_size=400)
    return folder, tokenizer


def load(source: Any, pipeline: list[ops.Op], **kwargs: Any) -> list[dict[str, Any]]:
    kwargs.setdefault("batch_size", 8)
    kwargs.setdefault("num_threads", 2)
    kwargs.setdefault("output", "numpy")
    with stoker.Loader(source, pipeline=pipeline, **kwargs) as loader:
        return list(loader)


def test_token_windows_come_as_zero_copy_uint16_rows(token_file: Path) -> None:
    with stoker.Loader(
        token_file, pipeline=[ops.TokenWindows(SEQ_LEN)], batch_size=8, output="numpy"
    ) as loader:
        assert loader.num_samples == 100
        assert len(loader) == 13
        batch = next(iter(loader))
    tokens = batch["tokens"]
    assert set(batch) == {"tokens"}
    assert tokens.dtype == np.uint16 and tokens.shape == (8, SEQ_LEN + 1)
    assert tokens.ctypes.data == buffer_behind(tokens).address
    for row in tokens:
        start = int(row[0])
        assert start % SEQ_LEN == 0
        np.testing.assert_array_equal(row, np.arange(start, start + SEQ_LEN + 1))


def test_every_window_once_per_epoch_across_ranks_by_uri_and_format(token_file: Path) -> None:
    seen: Counter[int] = Counter()
    for rank in range(4):
        source = f"file://{token_file}" if rank % 2 else str(token_file)
        for batch in load(source, [ops.TokenWindows(SEQ_LEN)], rank=rank, world_size=4,
                          format="tokens"):
            seen.update(int(t) // SEQ_LEN for t in batch["tokens"][:, 0])
    assert seen == Counter(range(100))


def test_token_batches_do_not_depend_on_threads(token_file: Path) -> None:
    def epoch(threads: int) -> list[np.ndarray]:
        return [b["tokens"].copy() for b in load(token_file, [ops.TokenWindows(SEQ_LEN)],
                                                 num_threads=threads, seed=5)]

    one, three = epoch(1), epoch(3)
    assert len(one) == len(three) == 13
    for a, b in zip(one, three, strict=True):
        np.testing.assert_array_equal(a, b)


def test_uint32_ids_under_a_uint16_name_are_refused_not_read_as_pairs(tmp_path: Path) -> None:
    """Llama 3's, Qwen's or Gemma's vocabulary written as uint32 under a plain ``.bin`` name
    would be read as uint16, each id's halves two tokens: refused by name; named
    ``*.u32.bin`` it is read."""
    plain = tmp_path / "train.bin"
    for vocabulary in (128_256, 151_646, 256_000):
        wide = (np.arange(100 * SEQ_LEN + 1) * 7919 % vocabulary).astype("<u4")
        wide.tofile(plain)
        with pytest.raises(ValueError, match=r"holds uint32 ids.*\*\.u32\.bin"):
            load(plain, [ops.TokenWindows(SEQ_LEN)])
    ids = (np.arange(100 * SEQ_LEN + 1) * 7919 % 151_646).astype("<u4")
    named = tmp_path / "train.u32.bin"
    ids.tofile(named)
    first = load(named, [ops.TokenWindows(SEQ_LEN)], shuffle=False)[0]["tokens"]
    np.testing.assert_array_equal(first[0], ids[: SEQ_LEN + 1])


def test_numpy_default_int64_ids_are_refused_not_read_as_four_tokens(tmp_path: Path) -> None:
    """``np.array(ids).tofile(path)`` writes int64, NumPy's default integer: read as uint16,
    every id would be four tokens, three of them 0. Refused, naming the dtype to write."""
    plain = tmp_path / "train.bin"
    for vocabulary in (50_257, 128_256):
        ids = np.arange(100 * SEQ_LEN + 1) * 7919 % vocabulary
        ids[::9] = 3
        np.array(ids).tofile(plain)
        with pytest.raises(ValueError, match=r"holds 64-bit ids.*int64.*uint16"):
            load(plain, [ops.TokenWindows(SEQ_LEN)])
    # GPT-2's ids as uint16 read as they are.
    ids = np.arange(100 * SEQ_LEN + 1) * 7919 % 50_257
    ids.astype("<u2").tofile(plain)
    first = load(plain, [ops.TokenWindows(SEQ_LEN)], shuffle=False)[0]["tokens"]
    np.testing.assert_array_equal(first[0], ids[: SEQ_LEN + 1])


def test_token_files_can_reach_torch(token_file: Path) -> None:
    torch = pytest.importorskip("torch")
    batch = load(token_file, [ops.TokenWindows(SEQ_LEN)], output="torch")[0]
    assert batch["tokens"].dtype == torch.uint16
    assert tuple(batch["tokens"].shape) == (8, SEQ_LEN + 1)


def test_packed_text_rows_eos_and_boundaries(text: tuple[Path, Path]) -> None:
    folder, tokenizer = text
    pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(SEQ_LEN, pad_id=1)]
    batches = load(folder, pipeline, seed=3)
    assert len(batches) == 7
    for batch in batches:
        assert set(batch) == {"input_ids", "position_ids", "document_ids"}
        rows = batch["input_ids"].shape[0]
        for name in batch:
            assert batch[name].dtype == np.int32 and batch[name].shape == (rows, SEQ_LEN)
        ids, positions, documents = (
            batch[k] for k in ("input_ids", "position_ids", "document_ids")
        )
        assert (positions[:, 0] == 0).all()
        # EOS (id 0, the tokenizer's <|endoftext|>) ends a document wherever the next starts.
        flat_docs, flat_ids = documents.ravel(), ids.ravel()
        changes = np.nonzero(flat_docs[1:] != flat_docs[:-1])[0]
        assert (flat_ids[changes] == 0).all()
        pad = flat_docs == -1
        assert (flat_ids[pad] == 1).all()
    again = load(folder, pipeline, seed=3, num_threads=1)
    for a, b in zip(batches, again, strict=True):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_a_text_pipeline_reads_the_text_column_beside_images(
    text: tuple[Path, Path], tmp_path: Path
) -> None:
    """Captions beside images in Parquet: a tokenizing pipeline reads ``text`` (or the
    ``text_column`` named), not the image column the file also has."""
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    _, tokenizer = text
    texts = [document(i) for i in range(20)]
    table = pa.table({
        "image": pa.array([b"\xff\xd8\xff\xe0 not text \xff" for _ in texts], pa.binary()),
        "text": texts,
        "caption": texts[::-1],
    })
    pq.write_table(table, tmp_path / "captions.parquet")
    pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(SEQ_LEN, pad_id=1)]
    reference = tmp_path / "plain"
    reference.mkdir()
    (reference / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    (reference / "b.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in texts[::-1]))
    for column, source in ((None, reference / "a.jsonl"), ("caption", reference / "b.jsonl")):
        got = load(tmp_path / "captions.parquet", pipeline, shuffle=False, on_error="fail",
                   text_column=column)
        want = load(source, pipeline, shuffle=False, on_error="fail")
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a["input_ids"], b["input_ids"])


def test_an_interrupt_as_a_batchs_log_records_are_handed_over_loses_no_step(
    text: tuple[Path, Path],
) -> None:
    """A handler of the ``stoker`` logger that raises (a Ctrl-C met while it writes) as the
    records the native side logged are handed over, just after a batch was taken: that batch
    went with the error, and a loop that caught it and went on got the step after it, one
    step never seen. The epoch goes on from that step now."""
    import time

    folder, tokenizer = text
    pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(4)]
    settings: dict[str, Any] = {"batch_size": 8, "num_threads": 1, "seed": 3}
    want = [batch["input_ids"].copy() for batch in load(folder, pipeline, **settings)]

    class Interrupting(logging.Handler):
        raised = 0

        def emit(self, record: logging.LogRecord) -> None:
            if "PackSequences dropped" in record.getMessage() and not self.raised:
                self.raised += 1
                raise KeyboardInterrupt

    handler = Interrupting()
    logger = logging.getLogger("stoker")
    logger.addHandler(handler)
    got: list[Any] = []
    try:
        with stoker.Loader(folder, pipeline=pipeline, output="numpy", **settings) as loader:
            iterator = iter(loader)
            while True:
                # The batch (and the record its packing logged) is ready before next() asks.
                time.sleep(0.05)
                try:
                    got.append(next(iterator)["input_ids"].copy())
                except KeyboardInterrupt:
                    continue
                except StopIteration:
                    break
    finally:
        logger.removeHandler(handler)
    assert handler.raised == 1
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)


def test_packing_ids_past_the_tokenizers_are_warned_about(
    text: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """An EOS or padding id past the tokenizer's ids is delivered as given (a model may have
    rows past them) and warned about once, by name, where the loader opens."""
    folder, tokenizer = text
    pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(SEQ_LEN, eos_id=70_000, pad_id=50_000)]
    with caplog.at_level(logging.WARNING, logger="stoker"):
        batches = load(folder, pipeline, seed=3)
    warned = [r.getMessage() for r in caplog.records if "PackSequences" in r.getMessage()]
    assert len(warned) == 2, caplog.text
    assert f"eos_id 70000 is past the ids of the tokenizer {tokenizer} (0.." in warned[0]
    assert "pad_id 50000 is past" in warned[1]
    assert any((batch["input_ids"] == 70_000).any() for batch in batches)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="stoker"):
        load(folder, [ops.Tokenize(tokenizer), ops.PackSequences(SEQ_LEN, eos_id=0, pad_id=1)])
    assert "PackSequences" not in caplog.text


def test_tokens_packing_drops_are_counted(
    text: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """Rows too short for their batch's documents drop the rest: ``stats()["tokens_dropped"]``
    counts it, so the tokens delivered and dropped add up to the epoch's tokens (EOS included)
    that rows long enough deliver whole. Each loader says once on logger ``stoker`` that it
    drops most tokens, or pads most rows."""
    folder, tokenizer = text
    caplog.set_level(logging.WARNING, logger="stoker")

    def delivered_and_dropped(seq_len: int) -> tuple[int, int]:
        pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(seq_len)]
        with stoker.Loader(folder, pipeline=pipeline, batch_size=5, seed=3, output="numpy",
                           num_threads=2) as loader:
            delivered = sum(int((b["document_ids"] >= 0).sum()) for b in loader)
            return delivered, int(loader.stats()["tokens_dropped"])

    whole, none_dropped = delivered_and_dropped(4096)
    assert none_dropped == 0
    said = [r.getMessage() for r in caplog.records if "PackSequences" in r.getMessage()]
    assert len(said) == 1 and "padded" in said[0] and "document_ids == -1" in said[0], said
    caplog.clear()
    delivered, dropped = delivered_and_dropped(4)
    assert dropped > whole // 2
    assert delivered + dropped == whole
    said = [r.getMessage() for r in caplog.records if "PackSequences" in r.getMessage()]
    assert len(said) == 1 and "dropped" in said[0] and "raise seq_len" in said[0], said


def test_bad_lines_are_skipped_or_fail_naming_file_and_line(text: tuple[Path, Path]) -> None:
    folder, tokenizer = text
    pipeline = [ops.Tokenize(tokenizer), ops.PackSequences(SEQ_LEN)]
    with stoker.Loader(folder, pipeline=pipeline, batch_size=10, output="numpy",
                       format="jsonl", shuffle_window=1) as loader:
        for _ in loader:
            pass
        assert loader.stats()["bad_samples"] == 1
    with pytest.raises(stoker.DecodeError, match=r"b\.jsonl:2"):
        load(folder, pipeline, on_error="fail", shuffle=False)


def test_token_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="seq_len"):
        ops.TokenWindows(0)
    with pytest.raises(ValueError, match="eos_id"):
        ops.PackSequences(16, eos_id=-2)
    with pytest.raises(stoker.PipelineError, match="unsupported token pipeline"):
        stoker.ops.check_pipeline([ops.PackSequences(16)])
    with pytest.raises(ValueError, match="unsupported token pipeline"):
        stoker.ops.check_pipeline([ops.TokenWindows(8), ops.RandomHorizontalFlip()])
    assert ops.PackSequences(16).to_dict() == {
        "op": "pack_sequences", "seq_len": 16, "eos_id": -1, "pad_id": 0,
    }


def test_format_must_be_known_and_match(token_file: Path) -> None:
    with pytest.raises(ValueError, match="format must be"):
        stoker.Loader(token_file, pipeline=[ops.TokenWindows(8)], batch_size=2, format="csv")
    with pytest.raises(ValueError, match="TokenWindows reads token files, Megatron corpora"):
        stoker.Loader(token_file, pipeline=[ops.TokenWindows(8)], batch_size=2, format="jsonl")


def write_megatron(prefix: Path, documents: list[list[int]], code: int) -> None:
    """``prefix.bin`` + ``prefix.idx`` laid out as Megatron's index writer lays them out:
    ``MMIDIDX\\0\\0``, version 1, the dtype code (8 uint16, 4 int32), the sequence and document
    counts, then each sequence's length (int32), byte offset (int64), and the sequence index
    where each document starts (int64, ending with the count)."""
    dtype = {8: "<u2", 4: "<i4"}[code]
    np.concatenate([np.asarray(d, dtype=dtype) for d in documents]).tofile(f"{prefix}.bin")
    count = len(documents)
    lengths = np.asarray([len(d) for d in documents], dtype="<i4")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype("<i8")
    pointers = starts * np.dtype(dtype).itemsize
    header = b"MMIDIDX\x00\x00" + np.asarray([1], "<u8").tobytes() + bytes([code])
    header += np.asarray([count, count + 1], "<u8").tobytes()
    documents_index = np.arange(count + 1, dtype="<i8")
    Path(f"{prefix}.idx").write_bytes(
        header + lengths.tobytes() + pointers.tobytes() + documents_index.tobytes()
    )


def test_a_megatron_corpus_reads_with_the_dtype_its_index_names(tmp_path: Path) -> None:
    # int32 ids above uint16's range, in a file whose name alone would say uint16.
    documents = [[70_000 + 100 * d + t for t in range(5 + d)] for d in range(40)]
    prefix = tmp_path / "corpus_text_document"
    write_megatron(prefix, documents, code=4)
    flat = np.concatenate([np.asarray(d) for d in documents])
    # By its .bin, its .idx, or its prefix as Megatron's --data-path names it.
    for source in (f"{prefix}.bin", f"{prefix}.idx", str(prefix)):
        batches = load(source, [ops.TokenWindows(SEQ_LEN)], shuffle=False)
        rows = np.concatenate([b["tokens"] for b in batches])
        assert rows.dtype == np.uint32
        assert len(rows) == (len(flat) - 1) // SEQ_LEN
        for k, row in enumerate(rows):
            assert row.tolist() == flat[k * SEQ_LEN : k * SEQ_LEN + SEQ_LEN + 1].tolist()
    # A .bin shorter than its index says is an error naming it.
    data = Path(f"{prefix}.bin").read_bytes()
    Path(f"{prefix}.bin").write_bytes(data[:-4])
    with pytest.raises(stoker.DatasetError, match=r"corpus_text_document\.bin is .* shorter"):
        load(f"{prefix}.bin", [ops.TokenWindows(SEQ_LEN)])


def test_megatron_corpora_mix_by_weight(tmp_path: Path) -> None:
    """Two corpora weighed as a Megatron blend is: each window's source follows the weights."""
    corpora = []
    for k, code in enumerate((8, 4)):
        prefix = tmp_path / f"corpus{k}"
        write_megatron(prefix, [[1000 * k + t for t in range(50)] for _ in range(40)], code=code)
        corpora.append(f"{prefix}.bin")
    with pytest.raises(ValueError, match=r"DTYPE_UINT16 \[33\], source 1 gives .* DTYPE_UINT32"):
        # A mix's sources must give the same tensors: uint16 and int32 corpora do not.
        stoker.mix({corpora[0]: 1, corpora[1]: 1}, pipeline=[ops.TokenWindows(SEQ_LEN)],
                   batch_size=8, output="numpy")
    write_megatron(tmp_path / "corpus2", [[7] * 50 for _ in range(40)], code=4)
    # A Megatron blend string names the same mix.
    blend = f"3 {tmp_path / 'corpus1'} 1 {tmp_path / 'corpus2'}.idx"
    assert stoker.megatron_blend(blend) == {corpora[1]: 3.0, f"{tmp_path / 'corpus2'}.bin": 1.0}
    # Without weights, as Megatron weighs such a blend: by the corpora's sizes (2,000 int32
    # tokens against 500), not alike.
    write_megatron(tmp_path / "corpus3", [[5] * 50 for _ in range(10)], code=4)
    unweighted = f"{tmp_path / 'corpus1'} {tmp_path / 'corpus3'}.bin"
    assert stoker.megatron_blend(unweighted) == {
        corpora[1]: 2000.0, f"{tmp_path / 'corpus3'}.bin": 500.0,
    }
    with stoker.mix(stoker.megatron_blend(blend),
                    pipeline=[ops.TokenWindows(SEQ_LEN)], batch_size=8, window=4,
                    output="numpy") as mixed:
        sources = Counter(np.concatenate([b["source"] for b in mixed]).tolist())
    assert sources[0] == 3 * sources[1] > 0


def test_megatron_windows_carry_positions_and_documents_restarting_at_each_boundary(
    tmp_path: Path,
) -> None:
    # Document d holds tokens 100 * d + t: a token says its document and its place in it.
    lengths = [5, 3, 9, 2, 7, 1, 12, 4, 40, 6] * 4
    documents = [[100 * d + t for t in range(n)] for d, n in enumerate(lengths)]
    prefix = tmp_path / "docs_text_document"
    write_megatron(prefix, documents, code=4)
    pipeline = [ops.TokenWindows(SEQ_LEN, document_boundaries=True)]
    batches = load(f"{prefix}.bin", pipeline, seed=3)
    assert sum(len(b["tokens"]) for b in batches) == (sum(lengths) - 1) // SEQ_LEN
    for batch in batches:
        assert set(batch) == {"tokens", "position_ids", "document_ids"}
        for name in ("position_ids", "document_ids"):
            assert batch[name].dtype == np.int32
            assert batch[name].shape == batch["tokens"].shape
        for tokens, positions, ids in zip(
            batch["tokens"], batch["position_ids"], batch["document_ids"], strict=True
        ):
            document = tokens // 100
            new = np.concatenate([[True], document[1:] != document[:-1]])
            assert ids.tolist() == (np.cumsum(new) - 1).tolist()
            # Positions restart at the row start and at each document start; a document
            # begun in an earlier window restarts at 0 here, not at its place (tokens % 100).
            expected = []
            for k, starts in enumerate(new):
                expected.append(0 if starts else expected[k - 1] + 1)
            assert positions.tolist() == expected
            inner = np.flatnonzero(new[1:]) + 1
            assert (tokens[inner] % 100 == 0).all(), "ids change at document starts only"
    # Without the switch the batch is as before.
    plain = load(f"{prefix}.bin", [ops.TokenWindows(SEQ_LEN)], seed=3)
    assert set(plain[0]) == {"tokens"}
    pairs = zip(plain, batches, strict=True)
    assert all(np.array_equal(a["tokens"], b["tokens"]) for a, b in pairs)
    # A token file without a document index cannot give them.
    flat = tmp_path / "flat.bin"
    np.arange(500, dtype="<u2").tofile(flat)
    with pytest.raises(ValueError, match="document index"):
        load(flat, pipeline)
    assert ops.TokenWindows(8, document_boundaries=True).to_dict() == {
        "op": "token_windows", "seq_len": 8, "document_boundaries": True,
    }
    with pytest.raises(ValueError, match="document_boundaries must be a bool"):
        ops.TokenWindows(8, document_boundaries=1)  # type: ignore[arg-type]


def test_megatron_blends_are_read_as_megatron_reads_them() -> None:
    assert stoker.megatron_blend(["0.3", "a_text_document", "0.7", "b.bin"]) == {
        "a_text_document.bin": 0.3, "b.bin": 0.7,
    }
    # Unweighted prefixes weigh their sizes, read from their files.
    with pytest.raises(ValueError, match="cannot be read"):
        stoker.megatron_blend("a b.idx")
    with pytest.raises(ValueError, match="give the blend's weights"):
        stoker.megatron_blend("s3://bucket/a s3://bucket/b")
    for bad, problem in [("", "at least one"), ("0.3 a 0.7", "alternates"),
                         ("0 a 1 b", "positive"), ("-1 a 1 b", "positive"),
                         ("0.5 a 0.5 a.bin", "twice"), ("0.5 0.5", "stands where")]:
        with pytest.raises(ValueError, match=problem):
            stoker.megatron_blend(bad)


# Corpora megatron-core's own IndexedDatasetBuilder wrote (`fixtures/write_megatron_core.py` says
# how; committed, so no megatron-core install is needed here).
MEGATRON_CORE = Path(__file__).parent / "fixtures" / "megatron_core"


@pytest.mark.parametrize(
    ("prefix", "dtype"),
    [("wide_text_document", np.uint32), ("sentences_text_document", np.uint16)],
)
def test_corpora_megatron_core_s_builder_wrote_give_their_documents(
    prefix: str, dtype: Any
) -> None:
    """One sequence per document (int32 ids past uint16's range), and documents of several
    sequences (``--split-sentences``): windows of the ids in order, documents where the index's
    document index puts them, not at each sequence."""
    documents = json.loads((MEGATRON_CORE / "documents.json").read_text())[prefix]
    flat = np.concatenate([np.asarray(d) for d in documents])
    document_of = np.concatenate([np.full(len(d), k) for k, d in enumerate(documents)])
    seq_len = 6
    pipeline = [ops.TokenWindows(seq_len, document_boundaries=True)]
    batches = load(MEGATRON_CORE / f"{prefix}.bin", pipeline, shuffle=False, drop_last=False)
    rows = {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}
    assert rows["tokens"].dtype == dtype
    assert len(rows["tokens"]) == (len(flat) - 1) // seq_len
    for k, row in enumerate(rows["tokens"]):
        window = slice(k * seq_len, k * seq_len + seq_len + 1)
        assert row.tolist() == flat[window].tolist()
        here = document_of[window]
        new = np.concatenate([[True], here[1:] != here[:-1]])
        assert rows["document_ids"][k].tolist() == (np.cumsum(new) - 1).tolist()
        expected: list[int] = []
        for j, starts in enumerate(new):
            expected.append(0 if starts else expected[j - 1] + 1)
        assert rows["position_ids"][k].tolist() == expected
