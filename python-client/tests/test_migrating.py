"""docs/migrating.md: every Python snippet runs as written, over small data of the kind its
section names (an image folder, WebDataset-style shards, a hub repository with two splits, MDS
shards and a Megatron corpus written in their published layouts)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from test_mds import token_array, write_mds, write_mds_columns
from test_tokens import write_megatron

from conftest import REPO, daemon_binary

DOC = REPO / "docs" / "migrating.md"


def snippets() -> dict[str, str]:
    """Each section's Python code blocks, by the section's heading."""
    found: dict[str, str] = {}
    section = ""
    for part in re.split(r"^(## .*)$", DOC.read_text(), flags=re.MULTILINE):
        if part.startswith("## "):
            section = part[3:].strip()
            continue
        blocks = re.findall(r"```python\n(.*?)```", part, flags=re.DOTALL)
        if blocks:
            found[section] = "\n".join(blocks)
    return found


@pytest.fixture(scope="module")
def data(dataset: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The names the snippets use, over the session's sample set."""
    stoker_cli = str(daemon_binary("stoker"))
    root = tmp_path_factory.mktemp("migrating")
    shards = root / "shards"
    subprocess.run([stoker_cli, "convert", "--from", str(dataset), "--to", "tar",
                    "--out", str(shards), "--shard-size", "1"],
                   check=True, capture_output=True, timeout=180)
    assert len(list(shards.glob("shard-*.tar"))) >= 4
    parquet = root / "parquet"
    subprocess.run([stoker_cli, "convert", "--from", str(dataset), "--to", "parquet",
                    "--out", str(parquet), "--shard-size", "1"],
                   check=True, capture_output=True, timeout=180)
    parts = sorted(parquet.glob("*.parquet"))
    hub = root / "hub"
    (hub / "data").mkdir(parents=True)
    (hub / "README.md").write_text("a dataset card\n")
    for k, part in enumerate(parts[:-1]):
        shutil.copy(part, hub / "data" / f"train-{k:05d}-of-{len(parts) - 1:05d}.parquet")
    shutil.copy(parts[-1], hub / "data" / "test-00000-of-00001.parquet")
    documents = [[70_000 + 50 * d + t for t in range(20 + d % 7)] for d in range(60)]
    megatron = root / "corpus_text_document"
    write_megatron(megatron, documents, code=4)
    classes = sorted(p.name for p in dataset.iterdir() if p.is_dir())
    images = [(f.read_bytes(), k) for k, c in enumerate(classes)
              for f in sorted((dataset / c).iterdir())]
    write_mds(root / "mds", images, per_shard=40, compress=True)
    write_mds_columns(root / "mds_tokens", {"tokens": "ndarray:uint32"},
                      [[token_array(d)] for d in documents], per_shard=16, compress=True)
    return {"image_root": dataset, "shard_dir": shards, "hub_repo": hub,
            "megatron_prefix": megatron, "mds_root": root / "mds",
            "mds_tokens_root": root / "mds_tokens", "rank": 1, "world_size": 2}


def test_the_page_has_one_runnable_section_per_peer() -> None:
    assert set(snippets()) == {
        "PyTorch `DataLoader` with `DistributedSampler`",
        "WebDataset",
        "Hugging Face `datasets`",
        "Mosaic Streaming (MDS)",
        "Megatron-LM, NeMo and GPT-NeoX indexed corpora",
    }


@pytest.mark.parametrize("section", sorted(snippets()))
def test_each_snippet_runs(section: str, data: dict[str, Any]) -> None:
    names = dict(data)
    exec(compile(snippets()[section], f"{DOC}:{section}", "exec"), names)
    loader = names["loader"]
    if "token_loader" in names:
        # LLM Foundry's token shards: the same documents as the Megatron corpus.
        windows, positions = names["windows"], names["positions"]
        assert windows.shape == (8, 33) and windows.dtype.name == "uint32"
        assert windows.min() >= 70_000
        assert positions.shape == windows.shape and (positions == 0).sum() > len(windows)
    try:
        assert loader.num_samples > 0
        if "tokens" in names:
            assert names["tokens"].shape[1:] == (33,)
            assert names["tokens"].dtype.name == "uint32"     # the .idx's int32, not the name's
            for ids in ("positions", "documents"):
                assert names[ids].shape == names["tokens"].shape
                assert names[ids].dtype.name == "int32"
            # Every document here is 20-26 tokens long: a window of 33 crosses a boundary.
            assert (names["documents"][:, -1] >= 1).all()
            assert (names["positions"] == 0).sum() > len(names["tokens"])
            return
        assert names["images"].shape[1:] == (64, 64, 3)
        assert names["labels"].shape == (names["images"].shape[0],)
    finally:
        loader.close()
