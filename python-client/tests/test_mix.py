"""stoker.mix: sources mixed by weight with exact counts per window, the same stream for the
same seed, each epoch rule, exact resume (also on another world size), per-source pipelines,
text packed after mixing, the distributed mode, and the errors for mixes that cannot work."""

from __future__ import annotations

import json
import logging
import pickle
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import stoker
from stoker import _native, ops
from stoker._mix import MixedDataset

SEQ_LEN = 7


def write_tokens(path: Path, source: int, windows: int) -> None:
    """Token i of source s is s * 30000 + i % 30000: a window's first token names its source
    and start."""
    tokens = np.arange(windows * SEQ_LEN + 1) % 30000 + source * 30000
    tokens.astype("<u2").tofile(path)


@pytest.fixture(scope="module")
def token_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """8,000 windows of source 0 and 4,000 of source 1."""
    root = tmp_path_factory.mktemp("mix-tokens")
    a, b = root / "web.bin", root / "code.bin"
    write_tokens(a, 0, 8000)
    write_tokens(b, 1, 4000)
    return a, b


def token_mix(files: tuple[Path, Path], **kwargs: Any) -> stoker.Loader:
    kwargs.setdefault("batch_size", 64)
    kwargs.setdefault("num_threads", 2)
    kwargs.setdefault("output", "numpy")
    kwargs.setdefault("seed", 5)
    a, b = files
    return stoker.mix({a: 0.7, b: 0.3}, pipeline=[ops.TokenWindows(SEQ_LEN)], **kwargs)


def rows(batches: Iterator[dict[str, Any]] | stoker.Loader) -> list[tuple[int, int]]:
    """(source, first token) of every row, checking that the tokens come from that source."""
    out = []
    for batch in batches:
        sources = batch["source"].tolist()
        firsts = batch["tokens"][:, 0].tolist()
        for source, first in zip(sources, firsts, strict=True):
            assert first // 30000 == source
            out.append((source, first))
    return out


def test_every_window_of_100_holds_exactly_70_and_30_over_10000_samples(
    token_files: tuple[Path, Path],
) -> None:
    with token_mix(token_files, epoch_end=10_000) as loader:
        assert loader.num_samples == 10_000
        seen = rows(loader)
    assert len(seen) == 10_000
    for start in range(0, 10_000, 100):
        counts = Counter(source for source, _ in seen[start : start + 100])
        assert counts == {0: 70, 1: 30}, f"window {start // 100}"
    assert len(set(seen)) == 10_000, "within one pass of each source: no window twice"


def test_weights_the_window_rounds_far_off_are_warned_about(
    token_files: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = token_files
    pipeline = [ops.TokenWindows(SEQ_LEN)]
    with (caplog.at_level(logging.WARNING, logger="stoker"),
          stoker.mix({a: 0.985, b: 0.015}, pipeline=pipeline, batch_size=8)):
        pass
    assert any("source 1 asks 0.0150 of the mix and gets 0.0100" in r.getMessage()
               for r in caplog.records), caplog.text
    caplog.clear()
    with (caplog.at_level(logging.WARNING, logger="stoker"),
          stoker.mix({a: 0.985, b: 0.015}, pipeline=pipeline, batch_size=8, window=1000)):
        pass
    assert not any("rounds its weights" in r.getMessage() for r in caplog.records), caplog.text


def test_the_same_seed_gives_the_same_stream(token_files: tuple[Path, Path]) -> None:
    def stream(**kwargs: Any) -> list[bytes]:
        with token_mix(token_files, epoch_end=3000, **kwargs) as loader:
            return [b["tokens"].tobytes() + b["source"].tobytes() for b in loader]

    one = stream(num_threads=1)
    assert one == stream(num_threads=3)
    assert one != stream(seed=6)


def test_each_epoch_rule(token_files: tuple[Path, Path]) -> None:
    # Counts 70 and 30: 8000 // 70 = 114 windows, 4000 // 30 = 133; ceil(4000 / 30) = 134.
    for epoch_end, samples in [("first_exhausted", 11_400), ("all_exhausted", 13_400), (250, 250)]:
        with token_mix(token_files, epoch_end=epoch_end, batch_size=100) as loader:
            assert loader.num_samples == samples
            assert len(loader) == -(-samples // 100)
            seen = rows(loader)
        assert len(seen) == samples
        per_source = Counter(source for source, _ in seen)
        if epoch_end == "first_exhausted":
            assert len(set(seen)) == samples, "no sample twice"
        if epoch_end == "all_exhausted":
            assert len({s for s in seen if s[0] == 0}) == 8000, "every sample of source 0"
            assert len({s for s in seen if s[0] == 1}) == 4000, "every sample of source 1"
            assert per_source[0] == 134 * 70


def test_a_mixed_epoch_resumes_exactly(token_files: tuple[Path, Path]) -> None:
    with token_mix(token_files) as loader:
        whole = rows(loader)
    with token_mix(token_files) as first:
        iterator = iter(first)
        head = rows(batch for _, batch in zip(range(30), iterator, strict=False))
        state = first.state_dict()
    assert state["mix"]["sources"][0][1] == 0.7 and state["mix"]["window"] == 100
    with token_mix(token_files) as resumed:
        resumed.load_state_dict(state)
        assert head + rows(resumed) == whole
    a, b = token_files
    with stoker.mix(
        {a: 0.6, b: 0.4}, pipeline=[ops.TokenWindows(SEQ_LEN)], batch_size=64, output="numpy"
    ) as other, pytest.raises(ValueError, match="mix"):
        other.load_state_dict(state)
    # A state without a mix (a plain loader's) into a mix, and the reverse: refused by name.
    plain = {key: value for key, value in state.items() if key != "mix"}
    with token_mix(token_files) as mixed, pytest.raises(ValueError, match="mix: saved None"):
        mixed.load_state_dict(plain)


def test_a_mix_of_moved_files_resumes_and_a_source_of_another_size_is_named(
    token_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """The same files in another folder are the same mix (the dataset fingerprint compares
    what they hold); a source that changed size is refused saying so, not as other
    settings."""
    import shutil

    a, b = token_files
    windows = [ops.TokenWindows(SEQ_LEN)]

    def mixed(x: Path, y: Path) -> stoker.Loader:
        return stoker.mix({x: 3, y: 1}, pipeline=windows, batch_size=64, output="numpy",
                          seed=1)

    with mixed(a, b) as loader:
        it = iter(loader)
        next(it), next(it)
        state = loader.state_dict()
        rest = [np.array(batch["tokens"]) for batch in it]
    moved = tmp_path / "moved"
    moved.mkdir()
    x, y = shutil.copy(a, moved), shutil.copy(b, moved)
    with mixed(Path(x), Path(y)) as loader:
        loader.load_state_dict(state)
        again = [np.array(batch["tokens"]) for batch in loader]
    assert len(again) == len(rest)
    for one, two in zip(rest, again, strict=True):
        np.testing.assert_array_equal(one, two)
    with open(x, "ab") as grown:
        grown.write(np.zeros(SEQ_LEN * 50, dtype="<u2").tobytes())
    with mixed(Path(x), Path(y)) as loader, pytest.raises(ValueError, match="changed size"):
        loader.load_state_dict(state)


def test_sources_of_one_file_name_in_other_folders_are_told_apart_on_resume(
    tmp_path: Path,
) -> None:
    """``a/tokens.bin`` and ``b/tokens.bin`` of one size, listed the other way round: every
    position would draw from the other file, so the state is refused; the whole tree moved
    resumes."""
    for folder, source in (("a", 0), ("b", 1)):
        (tmp_path / folder).mkdir()
        write_tokens(tmp_path / folder / "tokens.bin", source, 500)

    def mixed(root: Path, order: str) -> stoker.Loader:
        return stoker.mix({root / name / "tokens.bin": 1 for name in order},
                          pipeline=[ops.TokenWindows(SEQ_LEN)], batch_size=8, output="numpy",
                          seed=3)

    with mixed(tmp_path, "ab") as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
    with mixed(tmp_path, "ba") as swapped, pytest.raises(ValueError, match="mix: saved"):
        swapped.load_state_dict(state)
    moved = tmp_path / "moved"
    for name in "ab":
        shutil.copytree(tmp_path / name, moved / name)
    with mixed(moved, "ab") as loader:
        loader.load_state_dict(state)


def test_a_tokenizer_is_compared_by_its_contents_not_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folders, tokenizer = text_sources(tmp_path)

    def loader(path: str | Path) -> stoker.Loader:
        return stoker.Loader(folders[0], pipeline=[ops.Tokenize(path), ops.PackSequences(48)],
                             batch_size=4, output="numpy", num_threads=1)

    with loader(tokenizer) as first:
        next(iter(first))
        state = first.state_dict()
    # A state saved before tokenizers were named by their contents (its reading by path).
    with loader(tokenizer) as same:
        older = dict(state, reading=same._reading_by_path)
        assert older["reading"] not in (None, state["reading"])
        same.load_state_dict(older)
    monkeypatch.chdir(tokenizer.parent)
    with loader("tokenizer.json") as relative:
        relative.load_state_dict(state)  # the same tokenizer, named another way
    # Another tokenizer at the same path gives other ids: refused.
    _native.train_bpe_tokenizer([" ".join(reversed(WORDS))] * 20, str(tokenizer),
                                vocab_size=280)
    with loader(tokenizer) as other, pytest.raises(ValueError, match="reading: saved"):
        other.load_state_dict(state)


def test_a_mixed_epoch_resumes_on_another_world_size(token_files: tuple[Path, Path]) -> None:
    with token_mix(token_files, batch_size=100) as single:
        whole = Counter(rows(single))
    states, seen = [], []
    for rank in range(2):
        with token_mix(token_files, batch_size=100, rank=rank, world_size=2) as loader:
            iterator = iter(loader)
            seen += rows(batch for _, batch in zip(range(20), iterator, strict=False))
            states.append(loader.state_dict())
    for rank in range(3):
        with token_mix(token_files, batch_size=100, rank=rank, world_size=3) as loader:
            loader.load_state_dict(states)
            seen += rows(loader)
    # 11,400 - 4,000 = 7,400 rows left over 3 ranks: one padded repeat.
    assert len(seen) == 11_401
    assert set(seen) == set(whole) and len(whole) == 11_400


WORDS = ["alpha", "beta", "gamma", "delta", "stoker", "mixes", "text", "by", "weight"]


def text_sources(root: Path) -> tuple[list[Path], Path]:
    """Two folders of 30 JSONL documents each, and a tokenizer trained on their words."""
    folders = []
    for source in range(2):
        folder = root / f"docs{source}"
        folder.mkdir()
        lines = [
            json.dumps({"text": " ".join(WORDS[(i + w + source) % len(WORDS)] for w in range(9))})
            for i in range(30)
        ]
        (folder / "part.jsonl").write_text("\n".join(lines) + "\n")
        folders.append(folder)
    tokenizer = root / "tokenizer.json"
    # Past the 256 bytes and EOS, so it has merges of its own.
    _native.train_bpe_tokenizer([" ".join(WORDS)] * 20, str(tokenizer), vocab_size=300)
    return folders, tokenizer


def test_text_sources_are_packed_after_mixing(tmp_path: Path) -> None:
    folders, tokenizer = text_sources(tmp_path)
    pipeline = [ops.Tokenize(str(tokenizer)), ops.PackSequences(48)]
    with stoker.mix(
        {folders[0]: 1, folders[1]: 1},
        pipeline=pipeline,
        batch_size=8,
        window=4,
        output="numpy",
        num_threads=2,
    ) as loader:
        mixed_rows = 0
        for batch in loader:
            sources, documents = batch["source"], batch["document_ids"]
            assert sources.shape == (documents.shape[0],), "one source per document"
            for row in documents:
                in_row = {int(sources[d]) for d in row if d >= 0}
                mixed_rows += in_row == {0, 1}
    assert mixed_rows > 0, "a packed row holds documents of both sources"


def test_text_sources_whose_tokenizers_give_other_ids_are_refused(tmp_path: Path) -> None:
    """Packed rows hold documents of every source, so an id must mean one token in all: a
    second tokenizer with other ids is refused by name; the same one under another path is
    not."""
    folders, tokenizer = text_sources(tmp_path)
    other = tmp_path / "other.json"
    _native.train_bpe_tokenizer(["an unrelated corpus of other words"] * 20, str(other),
                                vocab_size=300)
    copy = tmp_path / "copy" / "tokenizer.json"
    copy.parent.mkdir()
    shutil.copy(tokenizer, copy)

    def mix(second: Path) -> stoker.Loader:
        def source(folder: Path, path: Path) -> stoker.Source:
            return stoker.Source(folder, pipeline=[ops.Tokenize(str(path)),
                                                   ops.PackSequences(48)])
        return stoker.mix({source(folders[0], tokenizer): 1, source(folders[1], second): 1},
                          batch_size=8, window=4, output="numpy", num_threads=2)

    with pytest.raises(ValueError, match="same id: source 0 and source 1 differ") as refused:
        mix(other)
    assert str(other) in str(refused.value)
    with mix(copy) as loader:
        assert sum(len(batch["input_ids"]) for batch in loader) > 0


def test_sources_keep_their_own_pipelines(dataset: Path) -> None:
    train = stoker.vision.imagenet_train(32)
    evaluation = stoker.Source(dataset, pipeline=stoker.vision.imagenet_eval(32))
    with stoker.mix(
        {dataset: 2, evaluation: 1}, pipeline=train, batch_size=12, window=3, output="numpy",
        num_threads=2,
    ) as loader:
        with stoker.Loader(dataset, pipeline=train, batch_size=1, output="numpy") as plain:
            assert loader.classes == plain.classes
        # 120 // 2 = 60 windows and 120 // 1 = 120: 60 windows of 3.
        assert loader.num_samples == 180
        epoch = [
            {k: np.array(v, copy=True) for k, v in batch.items()} for batch in loader
        ]
    assert set(epoch[0]) == {"image", "label", "source"}
    sources = np.concatenate([b["source"] for b in epoch])
    assert Counter(sources.tolist()) == {0: 120, 1: 60}
    assert all(Counter(sources[i : i + 3].tolist()) == {0: 2, 1: 1} for i in range(0, 180, 3))


def test_a_mix_runs_through_a_coordinator(dataset: Path, cluster: str) -> None:
    evaluation = stoker.Source(dataset, pipeline=stoker.vision.imagenet_eval(32))
    kwargs: dict[str, Any] = {
        "pipeline": stoker.vision.imagenet_train(32),
        "batch_size": 12,
        "window": 3,
        "output": "numpy",
    }

    def epoch(**extra: Any) -> list[bytes]:
        with stoker.mix({dataset: 2, evaluation: 1}, **kwargs, **extra) as loader:
            return [b"".join(np.ascontiguousarray(v).tobytes() for v in b.values()) for b in loader]

    assert epoch(address=cluster) == epoch(num_threads=2)


def test_mixes_that_cannot_work_are_refused_by_name(
    dataset: Path, token_files: tuple[Path, Path]
) -> None:
    a, b = token_files
    windows = [ops.TokenWindows(SEQ_LEN)]
    with pytest.raises(ValueError, match="source 1 gives"):
        stoker.mix(
            {dataset: 1, stoker.Source(dataset, pipeline=stoker.vision.imagenet_eval(48)): 1},
            pipeline=stoker.vision.imagenet_train(32),
            batch_size=4,
        )
    with pytest.raises(ValueError, match="positive"):
        stoker.mix({a: 1, b: 0}, pipeline=windows, batch_size=4)
    with pytest.raises(ValueError, match="raise the window"):
        stoker.mix({a: 1000, b: 1}, pipeline=windows, batch_size=4)
    with pytest.raises(ValueError, match="no pipeline"):
        stoker.mix({a: 1}, batch_size=4)
    with pytest.raises(ValueError, match="window"):
        stoker.mix({a: 1}, pipeline=windows, batch_size=4, window=2**20 + 1)
    with pytest.raises(ValueError, match="epoch_end"):
        stoker.mix({a: 1}, pipeline=windows, batch_size=4, epoch_end="never")
    with pytest.raises(TypeError, match="dict"):
        stoker.mix([a, b], pipeline=windows, batch_size=4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="map-style dataset"):
        stoker.mix({object(): 1}, pipeline=windows, batch_size=4)
    with pytest.raises(TypeError, match="not both"):
        stoker.mix({Numbers(0, 10): 1, a: 1}, pipeline=windows, batch_size=4)
    with pytest.raises(ValueError, match="first source runs out"):
        stoker.mix({a: 1, b: 1}, pipeline=windows, batch_size=4, window=20_000)


class Numbers:
    """A map-style dataset: sample i is {"value": offset + i}."""

    def __init__(self, offset: int, count: int) -> None:
        self.offset, self.count = offset, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.count:
            raise IndexError(index)
        return {"value": np.int64(self.offset + index)}


def dataset_mix(**kwargs: Any) -> stoker.Loader:
    kwargs.setdefault("batch_size", 50)
    kwargs.setdefault("output", "numpy")
    kwargs.setdefault("seed", 3)
    return stoker.mix({Numbers(0, 800): 0.7, Numbers(100_000, 400): 0.3}, **kwargs)


def dataset_rows(batches: Any) -> list[tuple[int, int]]:
    out = []
    for batch in batches:
        for value, source in zip(batch["value"].tolist(), batch["source"].tolist(), strict=True):
            assert (value >= 100_000) == (source == 1)
            out.append((source, value))
    return out


class NumbersWithABadOne(Numbers):
    """Numbers whose sample ``bad`` raises."""

    def __init__(self, offset: int, count: int, bad: int) -> None:
        super().__init__(offset, count)
        self.bad = bad

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index == self.bad:
            raise ValueError(f"sample {index} is corrupt")
        return super().__getitem__(index)


@pytest.mark.parametrize("mode", [{"num_threads": 1}, {"num_workers": 1}])
def test_a_bad_sample_of_a_mixed_dataset_is_replaced_from_its_own_source(mode: Any) -> None:
    """Under skip a bad sample is replaced by the next one of its own dataset, as a native mix
    replaces it, so each window keeps its counts; the bad sample is named by its dataset and
    index, not by its mixed position."""
    mixed = {NumbersWithABadOne(0, 20, bad=7): 0.5, Numbers(100_000, 20): 0.5}
    with stoker.mix(mixed, batch_size=40, window=40, output="numpy", seed=3, on_error="skip",
                    **mode) as loader:
        rows = dataset_rows(loader)
        stats = loader.stats()
    assert Counter(s for s, _ in rows) == {0: 20, 1: 20}
    assert 7 not in {v for s, v in rows if s == 0}
    assert stats["bad_samples"] == 1
    with (
        pytest.raises(stoker.DecodeError, match=r"dataset 0\[7\] \(mixed position \d+\)"),
        stoker.mix(mixed, batch_size=40, window=40, output="numpy", seed=3, **mode) as loader,
    ):
        list(loader)


class NumbersWithABadRun(Numbers):
    """Numbers whose first ``bad`` samples raise."""

    def __init__(self, offset: int, count: int, bad: int) -> None:
        super().__init__(offset, count)
        self.bad = bad

    def __getitem__(self, index: int) -> dict[str, Any]:
        if index < self.bad:
            raise ValueError(f"sample {index} is corrupt")
        return super().__getitem__(index)


def test_a_run_of_bad_samples_in_a_mixed_dataset_is_passed_over() -> None:
    """A mixed source's run of 20 bad samples ended the run under skip: its replacements were
    looked for among the next 16 of its samples only, not 32, 64... on as elsewhere."""
    mixed = {NumbersWithABadRun(0, 200, bad=20): 0.5, Numbers(100_000, 200): 0.5}
    with stoker.mix(mixed, batch_size=40, window=40, output="numpy", seed=3, on_error="skip",
                    shuffle=False, num_threads=1) as loader:
        rows = dataset_rows(loader)
        stats = loader.stats()
    assert Counter(s for s, _ in rows) == {0: 200, 1: 200}
    assert not {v for s, v in rows if s == 0} & set(range(20))
    assert stats["bad_samples"] == 20


def test_a_mixed_datasets_order_is_made_once_and_left_out_of_its_pickle() -> None:
    mixed = MixedDataset(
        [Numbers(0, 800), Numbers(100_000, 400)], [0.7, 0.3], 1 << 20, "samples", 5000, 3, True
    )
    order = mixed.order()
    assert mixed.order() is order, "kept between lookups"
    copy = pickle.loads(pickle.dumps(mixed))
    assert copy._order is None
    positions = [0, 1, 4999, 2500, 1]
    assert [copy[p] for p in positions] == [mixed[p] for p in positions]
    with pytest.raises(ValueError, match="past the mix's 5000 positions"):
        order.samples(0, [5000])


def test_python_datasets_mix_by_the_same_rule() -> None:
    with dataset_mix(epoch_end=1000, num_threads=2) as loader:
        assert loader.num_samples == 1000
        seen = dataset_rows(loader)
    for start in range(0, 1000, 100):
        assert Counter(s for s, _ in seen[start : start + 100]) == {0: 70, 1: 30}
    assert len(set(seen)) == 1000, "within one pass of each dataset"
    with dataset_mix(epoch_end=1000, num_threads=1) as again:
        assert dataset_rows(again) == seen, "the same stream for any thread count"
    # Worker processes started by spawn get the dataset pickled, without its native order.
    with dataset_mix(epoch_end=1000, num_workers=2, multiprocessing_context="spawn") as spawned:
        assert dataset_rows(spawned) == seen, "the same stream from worker processes"
    # first_exhausted: 800 // 70 = 11 and 400 // 30 = 13 windows.
    with dataset_mix() as loader:
        assert loader.num_samples == 1100
        whole = dataset_rows(loader)
    with dataset_mix() as first:
        iterator = iter(first)
        head = dataset_rows(batch for _, batch in zip(range(7), iterator, strict=False))
        state = first.state_dict()
    with dataset_mix() as resumed:
        resumed.load_state_dict(state)
        assert head + dataset_rows(resumed) == whole, "resumed exactly"
    # A state of a mix with other weights (or shuffle) names other batches: refused by name.
    assert state["mix"]["sources"] == [
        ["dataset of 800 samples", 0.7],
        ["dataset of 400 samples", 0.3],
    ]
    other = stoker.mix(
        {Numbers(0, 800): 0.5, Numbers(100_000, 400): 0.5}, batch_size=50, output="numpy", seed=3
    )
    with other, pytest.raises(ValueError, match="mix: saved"):
        other.load_state_dict(state)
    with dataset_mix(shuffle=False) as unshuffled, pytest.raises(ValueError, match="mix: saved"):
        unshuffled.load_state_dict(state)


def test_weights_that_normalise_the_same_are_the_same_mix(
    token_files: tuple[Path, Path],
) -> None:
    a, b = token_files
    windows = [ops.TokenWindows(SEQ_LEN)]
    with stoker.mix({a: 1, b: 1}, pipeline=windows, batch_size=64, output="numpy") as ones:
        state = ones.state_dict()
        first = rows(batch for _, batch in zip(range(3), ones, strict=False))
    with stoker.mix({a: 0.5, b: 0.5}, pipeline=windows, batch_size=64, output="numpy") as halves:
        halves.load_state_dict(state)
        assert rows(batch for _, batch in zip(range(3), halves, strict=False)) == first


def test_python_datasets_mixed_with_rounded_weights_are_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="stoker"), stoker.mix(
        {Numbers(0, 1000): 0.994, Numbers(100_000, 1000): 0.006}, batch_size=100,
        output="numpy", epoch_end=1000,
    ):
        pass
    assert any("source 1 asks 0.0060 of the mix and gets 0.0100" in r.getMessage()
               for r in caplog.records), caplog.text


def test_numpy_weights_and_counts_are_numbers(token_files: tuple[Path, Path]) -> None:
    a, b = token_files
    with stoker.mix({a: np.int64(7), b: np.float32(3.0)}, pipeline=[ops.TokenWindows(SEQ_LEN)],
                    batch_size=8, window=np.int64(100), epoch_end=np.int64(800),
                    output="numpy") as loader:
        assert loader.num_samples == 800
    with pytest.raises(ValueError, match="positive finite number"):
        stoker.mix({a: 10**400, b: 1}, pipeline=[ops.TokenWindows(SEQ_LEN)], batch_size=8)


def test_a_sources_own_source_column_is_refused_not_replaced(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    for name, value in (("a", 100), ("b", 101)):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"source": [value] * 20, "x": list(range(20))}),
                       tmp_path / name / "part.parquet")
    with pytest.raises(ValueError, match="tensor named 'source', which the mix adds"):
        stoker.mix({tmp_path / "a": 1, tmp_path / "b": 1}, batch_size=4, output="numpy", window=4,
                   pipeline=[ops.SelectColumns(["source", "x"])])


def test_sources_of_other_class_names_are_told_to_share_one_label_space(
    dataset: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    other = tmp_path / "other"
    shutil.copytree(dataset, other)
    for folder in sorted(p for p in other.iterdir() if p.is_dir()):
        folder.rename(folder.with_name("other-" + folder.name))
    with caplog.at_level(logging.WARNING, logger="stoker"), stoker.mix(
        {dataset: 1, other: 1}, pipeline=stoker.vision.imagenet_eval(32), batch_size=8,
        output="numpy",
    ) as loader:
        assert loader.classes == []
    assert any("have other class names: their labels share one number space"
               in r.getMessage() for r in caplog.records), caplog.text
