"""What train_tiny writes and how: the corpus and its held-out split, the tokenizer (a byte-level
BPE trained with `tokenizers`, or a byte fallback for smoke tests), safetensors, the trace.

Invariants:
- Every file is written to a temporary name and renamed into place, so a file that exists is
  whole.
- safetensors: written here (no library needed): an 8-byte little-endian header length, the
  JSON header (dtype, shape, data_offsets), then the tensors back to back in header order with no
  gap, the data region ending exactly at the end of the file (what lib/model/safetensors.hpp
  checks). BF16 is rounded to nearest even by torch.
- The trace follows docs/trace-format.md exactly (mtplab-trace version 1).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import sys
import traceback
import zlib
from pathlib import Path

import numpy as np
import torch

EOT = "<|endoftext|>"


def run_main(main) -> None:
    """Runs a command's main(argv) and exits with its status; any failure prints its traceback and
    exits 1, so that a run never ends with a zero status after an error."""
    try:
        sys.exit(main(sys.argv[1:]))
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - any failure must end the run with a non-zero status
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + f".tmp.{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def sha256_bytes(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


# ---- corpus -------------------------------------------------------------------------------------

def read_corpus(directory: Path, heldout_mod: int):
    """The *.py files directly under `directory`, sorted by name, as (name, text). A file is held
    out when crc32(name) % heldout_mod == 0: a split by file that does not depend on which other
    files exist (so 3.11 and 3.12 hold out the same names)."""
    files = sorted(f for f in directory.glob("*.py") if f.is_file())
    if not files:
        raise SystemExit(f"corpus: no *.py files under {directory}")
    train, held = [], []
    digest = hashlib.sha256()
    for f in files:
        text = f.read_bytes().decode("utf-8", errors="replace")
        digest.update(f.name.encode() + b"\0" + text.encode("utf-8") + b"\0")
        (held if zlib.crc32(f.name.encode()) % heldout_mod == 0 else train).append((f.name, text))
    if not held or not train:
        raise SystemExit(f"corpus: the split of {len(files)} files left an empty side")
    return train, held, digest.hexdigest()


# ---- tokenizer ----------------------------------------------------------------------------------

class ByteTokenizer:
    """Smoke-test fallback when `tokenizers` is missing: ids 0..255 are bytes, 256 is EOT; the rest
    of the vocab is unused. Never used for the published weights."""

    kind = "byte-fallback"

    def __init__(self, vocab: int):
        self.vocab = vocab
        self.eot = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")

    def to_json(self) -> str:
        return json.dumps({"kind": self.kind, "vocab": self.vocab, "bytes": "ids 0..255 are bytes 0..255",
                           "special": {EOT: self.eot}}, indent=1)


class BpeTokenizer:
    """Byte-level BPE trained with the `tokenizers` library on the training files only."""

    kind = "byte-level-bpe"

    def __init__(self, texts: list[str], vocab: int):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(texts, trainer=trainer)
        if tok.get_vocab_size() > vocab:
            raise SystemExit(f"tokenizer: trained vocab {tok.get_vocab_size()} exceeds the model's {vocab}")
        self.tok = tok
        self.vocab = vocab
        self.eot = tok.token_to_id(EOT)

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        # In chunks (an Encoding holds offsets and strings too: a whole corpus at once is gigabytes),
        # without offsets where the library can (encode_batch_fast: the same ids).
        batch = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch
        out = []
        for i in range(0, len(texts), 256):
            out.extend(e.ids for e in batch(texts[i: i + 256]))
        return out

    def decode(self, ids) -> str:
        return self.tok.decode(list(int(i) for i in ids))

    def to_json(self) -> str:
        return self.tok.to_str(pretty=True)


def make_tokenizer(texts: list[str], vocab: int, fallback: bool):
    if fallback:
        return ByteTokenizer(vocab)
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        raise SystemExit("tokenizer: the `tokenizers` library is missing; pass --fallback-tokenizer for a "
                         "smoke test (never for published weights)") from None
    return BpeTokenizer(texts, vocab)


def encode_files(tok, files) -> list[np.ndarray]:
    texts = [t for _, t in files]
    ids = tok.encode_many(texts) if hasattr(tok, "encode_many") else [tok.encode(t) for t in texts]
    return [np.asarray(i, dtype=np.int64) for i in ids]


def join_with_eot(arrays: list[np.ndarray], eot: int) -> np.ndarray:
    parts = []
    for a in arrays:
        parts.append(a)
        parts.append(np.array([eot], dtype=np.int64))
    return np.concatenate(parts)


# ---- safetensors --------------------------------------------------------------------------------

def write_safetensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> None:
    """tensors: name -> torch tensor (bfloat16 or float32), written in name order."""
    header: dict = {"__metadata__": metadata}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous().cpu()
        if t.dtype == torch.bfloat16:
            raw = t.view(torch.int16).numpy().tobytes()
            dtype = "BF16"
        elif t.dtype == torch.float32:
            raw = t.numpy().astype("<f4").tobytes()
            dtype = "F32"
        else:
            raise ValueError(f"safetensors: {name} has dtype {t.dtype}")
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # align the data region (allowed: trailing spaces)
    write_atomic(path, struct.pack("<Q", len(hjson)) + hjson + b"".join(blobs))


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """The reader twin of write_safetensors (for the self-check after writing)."""
    b = path.read_bytes()
    n = struct.unpack("<Q", b[:8])[0]
    header = json.loads(b[8: 8 + n])
    data = b[8 + n:]
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        lo, hi = h["data_offsets"]
        if h["dtype"] == "BF16":
            a = np.frombuffer(data[lo:hi], dtype="<i2").copy()
            out[name] = torch.from_numpy(a).view(torch.bfloat16).reshape(h["shape"])
        else:
            a = np.frombuffer(data[lo:hi], dtype="<f4").copy()
            out[name] = torch.from_numpy(a).reshape(h["shape"])
    return out


# ---- trace (docs/trace-format.md) ---------------------------------------------------------------

def bf16_bits(x: torch.Tensor) -> np.ndarray:
    """fp32 -> BF16 bit patterns (round to nearest even, as mtplab does)."""
    return x.detach().float().cpu().bfloat16().view(torch.int16).numpy().view(np.uint16)


def write_trace(path: Path, sequences, hidden: int, vocab: int, provenance: dict[str, str],
                attrs: dict | None = None) -> None:
    """sequences: list of (tokens int [L], hiddens fp32 torch [L, hidden], prompt_length). `attrs`: more
    root attributes (str as fixed-length strings, int as int64, float as float64), e.g. the sampling
    attributes of a sampled trace."""
    import h5py

    tmp = path.with_name(path.name + f".tmp.{os.getpid()}")
    lengths = [len(t) for t, _, _ in sequences]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    with h5py.File(tmp, "w", libver=("v110", "v110")) as f:
        f.attrs["format"] = np.bytes_("mtplab-trace")
        f.attrs["format_version"] = np.int64(1)
        f.attrs["hidden"] = np.int64(hidden)
        f.attrs["vocab"] = np.int64(vocab)
        f.attrs["num_sequences"] = np.int64(len(sequences))
        for key in ("generator", "model", "seed", "created_at", "git_sha", "config"):
            f.attrs[key] = np.bytes_(provenance.get(key, "").encode())
        for key, v in (attrs or {}).items():
            f.attrs[key] = (np.bytes_(v.encode()) if isinstance(v, str) else
                            np.int64(v) if isinstance(v, (int, np.integer)) else np.float64(v))
        f.create_dataset("tokens", data=np.concatenate([np.asarray(t) for t, _, _ in sequences]).astype(np.int32),
                         chunks=True, compression="gzip", shuffle=True, fletcher32=True)
        bits = np.concatenate([bf16_bits(h.reshape(-1, hidden)) for _, h, _ in sequences])
        rows = max(1, (256 << 10) // (2 * hidden))
        hs = f.create_dataset("hiddens", data=bits, chunks=(min(rows, len(bits)), hidden),
                              compression="gzip", shuffle=True, fletcher32=True)
        hs.attrs["dtype"] = np.bytes_("bf16")
        f.create_dataset("seq_offsets", data=offsets)
        f.create_dataset("prompt_lengths", data=np.array([p for _, _, p in sequences], np.int32))
    os.replace(tmp, path)


def read_trace(path: Path):
    """(tokens int64 [L], hiddens fp32 [L, H] holding the stored BF16 values, prompt_length) per
    sequence, as replay sees them."""
    import h5py

    out = []
    with h5py.File(path, "r") as f:
        fmt = f.attrs["format"]
        fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
        if fmt != "mtplab-trace" or int(f.attrs["format_version"]) != 1:
            raise SystemExit(f"{path}: not an mtplab-trace version 1")
        offs = f["seq_offsets"][()]
        tokens = f["tokens"][()].astype(np.int64)
        bits = f["hiddens"][()]
        prompts = f["prompt_lengths"][()]
        for s in range(len(prompts)):
            b, e = int(offs[s]), int(offs[s + 1])
            h = (bits[b:e].astype(np.uint32) << 16).view(np.float32)
            out.append((tokens[b:e], torch.from_numpy(h.copy()), int(prompts[s])))
    return out
