#!/usr/bin/env python3
"""Text at training speed: Hugging Face ``tokenizers``, a torch DataLoader and ``stoker.Loader``
on the same JSONL and ``tokenizer.json``, side by side in one run.

Rows:

- HF ``encode_batch``: the Python ``tokenizers`` package encoding every document, in chunks of
  ``--chunk`` documents, on all its threads (no packing: the tokenizer alone);
- DataLoader: a map-style dataset whose item ``i`` is batch ``i`` (``--batch-size`` documents
  read from the JSONL, parsed, tokenized with HF ``tokenizers`` and packed into
  ``--batch-size`` rows of ``--seq-len``, as Stoker packs them), ``--workers`` worker processes;
- Stoker: ``stoker.Loader`` with ``[Tokenize, PackSequences]`` on ``--threads`` threads.

Per row, over ``--epochs`` passes: tokens/s (the documents' tokens, which are the same ids in
every row: Stoker's are checked equal to HF's in its tests; so every row is charged for the
same tokens, packing
included where there is packing), CPU seconds per million tokens (the process's and its
children's), first batch (seconds from building the loader to its first batch), and the
speedup over HF. Every row's clock starts before its own setup: the tokenizer loaded, the
JSONL indexed (Stoker's loader, the DataLoader's dataset). A JSON object last.

Without ``--data`` it writes a corpus (``--corpus code``: the Python files of this
interpreter's standard library; ``prose``: the licence and copyright texts under
``/usr/share``) of ``--megabytes`` MB as JSONL; without ``--tokenizer`` it trains a byte-level
BPE of ``--vocab`` ids on it with HF ``tokenizers``.

    python3 benches/text_bench.py --corpus code --threads 2 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any


def cpu_seconds() -> float:
    """CPU seconds of this process and its waited-for children so far."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def figures(
    row: str, tokens: int, seconds: float, cpu_before: float, first: float | None
) -> dict[str, Any]:
    """One row's figures: ``tokens`` in ``seconds`` of wall time, the CPU used since
    ``cpu_before`` (read now) and the time to the first batch."""
    return {
        "row": row,
        "tokens": tokens,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds() - cpu_before,
        "first_batch_s": first,
    }


def write_corpus(kind: str, megabytes: float, out: Path) -> int:
    """Writes up to ``megabytes`` MB of documents as JSONL; returns how many."""
    if kind == "code":
        roots = [Path(sysconfig.get_paths()["stdlib"])]
        patterns = ["*.py"]
    else:
        roots = [Path("/usr/share/common-licenses"), Path("/usr/share/doc")]
        patterns = ["*", "copyright"]
    budget = int(megabytes * 1e6)
    written = 0
    count = 0
    with out.open("w", encoding="utf-8") as sink:
        for root in roots:
            for pattern in patterns:
                for path in sorted(root.rglob(pattern)):
                    if written >= budget:
                        return count
                    if not path.is_file() or path.stat().st_size > 2_000_000:
                        continue
                    if kind == "prose" and pattern == "*" and root.name != "common-licenses":
                        continue
                    try:
                        text = path.read_text(encoding="utf-8")
                    except (UnicodeDecodeError, OSError):
                        continue
                    if not text.strip():
                        continue
                    sink.write(json.dumps({"text": text}) + "\n")
                    written += len(text.encode())
                    count += 1
    return count


def read_texts(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as source:
        return [json.loads(line)["text"] for line in source if line.strip()]


def hf_row(
    hf: Any, tokenizer_path: Path, texts: list[str], chunk: int, epochs: int
) -> dict[str, Any]:
    cpu = cpu_seconds()
    started = time.perf_counter()
    tokenizer = hf.Tokenizer.from_file(str(tokenizer_path))
    tokens = 0
    first = None
    for _ in range(epochs):
        for start in range(0, len(texts), chunk):
            encodings = tokenizer.encode_batch(
                texts[start : start + chunk], add_special_tokens=False
            )
            tokens += sum(len(e.ids) for e in encodings)
            if first is None:
                first = time.perf_counter() - started
    seconds = time.perf_counter() - started
    return figures("hf-encode_batch", tokens, seconds, cpu, first)


class PackedBatches:
    """Map-style dataset: item ``i`` is batch ``i`` of the file, tokenized and packed in the
    worker (the DataLoader row)."""

    def __init__(
        self, data: Path, tokenizer_path: Path, batch_size: int, seq_len: int, eos: int
    ) -> None:
        self.data = data
        self.tokenizer_path = tokenizer_path
        self.batch_size = batch_size
        self.seq_len = seq_len
        self.eos = eos
        self.offsets: list[int] = []
        with data.open("rb") as source:
            offset = 0
            for line in source:
                if line.strip():
                    self.offsets.append(offset)
                offset += len(line)
        self._tokenizer: Any = None

    def __len__(self) -> int:
        return len(self.offsets) // self.batch_size

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import numpy as np
        import tokenizers

        if self._tokenizer is None:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(self.tokenizer_path))
        texts = []
        with self.data.open("rb") as source:
            for offset in self.offsets[index * self.batch_size : (index + 1) * self.batch_size]:
                source.seek(offset)
                texts.append(json.loads(source.readline())["text"])
        rows = np.zeros((self.batch_size, self.seq_len), dtype=np.int32)
        flat = rows.reshape(-1)
        at = 0
        tokens = 0
        for encoding in self._tokenizer.encode_batch(texts, add_special_tokens=False):
            ids = encoding.ids
            tokens += len(ids)
            piece = ids[: max(0, flat.size - at)]
            flat[at : at + len(piece)] = piece
            at += len(piece)
            if at < flat.size:
                flat[at] = self.eos
                at += 1
        return rows, tokens


def dataloader_row(
    data: Path, tokenizer_path: Path, args: Any, eos: int, batches: int
) -> dict[str, Any]:
    import torch

    cpu = cpu_seconds()
    started = time.perf_counter()
    dataset: Any = PackedBatches(data, tokenizer_path, args.batch_size, args.seq_len, eos)
    loader: Any = torch.utils.data.DataLoader(
        dataset,
        batch_size=None,
        num_workers=args.workers,
        persistent_workers=False,
    )
    tokens = 0
    first = None
    for _ in range(args.epochs):
        for count, (_, batch_tokens) in enumerate(loader, 1):
            tokens += int(batch_tokens)
            if first is None:
                first = time.perf_counter() - started
            if count >= batches:
                break
    seconds = time.perf_counter() - started
    del loader  # the workers exit and are waited for, so their CPU time counts
    return figures("dataloader", tokens, seconds, cpu, first)


def stoker_row(
    data: Path, tokenizer_path: Path, args: Any, doc_tokens: list[int], batches: int
) -> dict[str, Any]:
    import stoker

    cpu = cpu_seconds()
    started = time.perf_counter()
    loader = stoker.Loader(
        str(data),
        pipeline=[stoker.ops.Tokenize(str(tokenizer_path)), stoker.ops.PackSequences(args.seq_len)],
        batch_size=args.batch_size,
        shuffle=False,
        drop_last=True,
        num_threads=args.threads,
        output="numpy",
    )
    tokens = 0
    first = None
    for _ in range(args.epochs):
        iterator = iter(loader)
        for count, _ in enumerate(iterator, 1):
            tokens += sum(doc_tokens[i] for i in iterator.sample_indices)
            if first is None:
                first = time.perf_counter() - started
            if count >= batches:
                break
    seconds = time.perf_counter() - started
    stats = loader.stats()
    loader.close()
    return {
        **figures("stoker", tokens, seconds, cpu, first),
        # Decode-thread seconds by stage: reading (and parsing) the JSONL line, tokenizing,
        # packing.
        "read_s": stats["read_s"],
        "tokenize_s": stats["decode_s"],
        "pack_s": stats["assemble_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="JSONL with a 'text' field per line")
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json")
    parser.add_argument("--corpus", choices=["code", "prose"], default="code")
    parser.add_argument("--megabytes", type=float, default=20.0)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--chunk", type=int, default=256, help="documents per encode_batch call")
    parser.add_argument("--rows", default="hf,dataloader,stoker")
    parser.add_argument("--epochs", type=int, default=3, help="passes over the corpus per row")
    args = parser.parse_args()
    try:
        import tokenizers as hf
    except ImportError as error:
        print(f"text_bench: Hugging Face tokenizers is not importable ({error})")
        return 1

    work = Path(tempfile.mkdtemp(prefix="stoker-text-bench-"))
    data = args.data
    if data is None:
        data = work / f"{args.corpus}.jsonl"
        made = time.perf_counter()
        count = write_corpus(args.corpus, args.megabytes, data)
        print(f"wrote {count} documents ({data.stat().st_size / 1e6:.1f} MB) in "
              f"{time.perf_counter() - made:.1f} s")
    texts = read_texts(data)
    tokenizer_path = args.tokenizer
    if tokenizer_path is None:
        tokenizer_path = work / "tokenizer.json"
        trainer = hf.ByteLevelBPETokenizer()
        trainer.train_from_iterator(
            texts, vocab_size=args.vocab, min_frequency=2, special_tokens=["<|endoftext|>"]
        )
        trainer.save(str(tokenizer_path))
    reference = hf.Tokenizer.from_file(str(tokenizer_path))
    eos = reference.token_to_id("<|endoftext|>") or 0
    doc_tokens = [
        len(e.ids) for e in reference.encode_batch(texts, add_special_tokens=False)
    ]
    batches = len(texts) // args.batch_size
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    print(
        f"{len(texts)} documents, {megabytes:.1f} MB, {sum(doc_tokens)} tokens; "
        f"{os.cpu_count()} cores; seq_len {args.seq_len}, batch {args.batch_size}, "
        f"{args.threads} Stoker threads, {args.workers} DataLoader workers, "
        f"{args.epochs} passes per row, tokenizers {hf.__version__}",
        flush=True,
    )
    results = []
    for row in args.rows.split(","):
        if row == "hf":
            result = hf_row(hf, tokenizer_path, texts, args.chunk, args.epochs)
        elif row == "dataloader":
            result = dataloader_row(data, tokenizer_path, args, eos, batches)
        elif row == "stoker":
            result = stoker_row(data, tokenizer_path, args, doc_tokens, batches)
        else:
            raise SystemExit(f"unknown row {row!r}")
        result["tokens_per_s"] = result["tokens"] / result["seconds"]
        result["cpu_s_per_million_tokens"] = result["cpu_seconds"] / result["tokens"] * 1e6
        results.append(result)
    base = next((r["tokens_per_s"] for r in results if r["row"] == "hf-encode_batch"), None)
    for r in results:
        if base:
            r["x_hf"] = r["tokens_per_s"] / base
        print(
            f"{r['row']:16} {r['tokens_per_s']:12,.0f} tokens/s  "
            f"{r['cpu_s_per_million_tokens']:7.3f} CPU-s/M tokens  "
            f"first batch {r['first_batch_s']:.3f} s  "
            f"{r.get('x_hf', float('nan')):6.2f}x HF"
            + (
                f"  (threads: read {r['read_s']:.2f} s, tokenize {r['tokenize_s']:.2f} s, "
                f"pack {r['pack_s']:.2f} s)"
                if "read_s" in r
                else ""
            ),
            flush=True,
        )
    print(
        json.dumps(
            {
                "corpus": str(data),
                "documents": len(texts),
                "megabytes": megabytes,
                "cores": os.cpu_count(),
                "seq_len": args.seq_len,
                "batch_size": args.batch_size,
                "rows": results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
