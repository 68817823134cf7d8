"""Writes mtplab trace files (docs/trace-format.md) with h5py and numpy alone (no torch), so the
format side of the recorder can be checked on any machine (tools/record_trace/check_writer.py).

Layout, as lib/io/trace.cpp writes and reads it: root attributes format = "mtplab-trace",
format_version = 1, hidden, vocab, num_sequences and the provenance strings; /tokens int32 [T],
/hiddens [T, H] (uint16 BF16 bits with dtype = "bf16", or float32 with dtype = "f32"),
/seq_offsets int64 [N + 1], /prompt_lengths int32 [N], and optionally /routing int32
[T, layers x top_k] (each position's routed experts at every layer, -1 at a dense layer;
attributes layers, top_k, experts: docs/trace-format.md "Routing"). Strings are fixed-length, the file is in
the HDF5 1.10 format, data chunks are shuffled, deflated and fletcher32-checksummed, and the
file is written under a temporary name renamed into place by commit(), so a trace that exists
is whole.

Invariants checked as each sequence is added (the C++ reader refuses the same faults): every
token id in [0, vocab), 2 <= prompt_length <= length, hiddens [length, hidden] and finite; with
routing, its ids [length, layers x top_k] in [0, experts), or -1 in every column of a layer.
"""

from __future__ import annotations

import os

import h5py
import numpy as np

FORMAT = "mtplab-trace"
FORMAT_VERSION = 1
PROVENANCE_KEYS = ("generator", "model", "seed", "created_at", "git_sha", "config")


def to_bf16_bits(x) -> np.ndarray:
    """float32 -> BF16 bits, round to nearest even (as mtplab and the GPU round). x must be finite."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def bf16_round(x) -> np.ndarray:
    """float32 values rounded to BF16 and widened back (exact)."""
    return (to_bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


def _text(value) -> np.bytes_:
    return np.bytes_(str(value).encode("utf-8"))


class TraceWriter:
    """One trace, written sequence by sequence; nothing is at `path` until commit().

    dtype: "bf16" (the default: what the drafter reads) or "f32" (the hiddens exactly as given).
    provenance: the standard string attributes (PROVENANCE_KEYS); attrs: any further root
    attributes (str, int, float or bool), e.g. the sampling settings. routing: (layers, top_k,
    experts) to record every sequence's routing (add's routing= then required).
    """

    def __init__(self, path: str, hidden: int, vocab: int, dtype: str = "bf16",
                 provenance: dict | None = None, attrs: dict | None = None, deflate: int = 4,
                 routing: tuple[int, int, int] | None = None):
        if dtype not in ("bf16", "f32"):
            raise ValueError(f"{path}: dtype must be bf16 or f32, got {dtype!r}")
        if hidden <= 0 or not 0 < vocab < 2**31:
            raise ValueError(f"{path}: hidden {hidden} and vocab {vocab} must be positive (vocab < 2^31)")
        self.path, self.hidden, self.vocab, self.dtype = path, int(hidden), int(vocab), dtype
        self.tmp = f"{path}.tmp.{os.getpid()}"
        self.offsets = [0]
        self.prompt_lengths: list[int] = []
        self.f = h5py.File(self.tmp, "w", libver=("v110", "v110"))
        a = self.f.attrs
        a["format"] = _text(FORMAT)
        a["format_version"] = np.int64(FORMAT_VERSION)
        a["hidden"] = np.int64(self.hidden)
        a["vocab"] = np.int64(self.vocab)
        a["num_sequences"] = np.int64(0)
        prov = dict(provenance or {})
        for key in PROVENANCE_KEYS:
            a[key] = _text(prov.pop(key, ""))
        if prov:
            raise ValueError(f"{path}: unknown provenance keys {sorted(prov)} (use attrs=)")
        for key, value in (attrs or {}).items():
            self.set_attr(key, value)
        opts = dict(compression="gzip" if deflate else None, compression_opts=deflate or None,
                    shuffle=bool(deflate), fletcher32=True)
        self.tokens = self.f.create_dataset("tokens", shape=(0,), maxshape=(None,), dtype=np.int32,
                                            chunks=(1 << 16,), **opts)
        elem = 2 if dtype == "bf16" else 4
        rows = max(1, (256 << 10) // (elem * self.hidden))
        self.hiddens = self.f.create_dataset(
            "hiddens", shape=(0, self.hidden), maxshape=(None, self.hidden),
            dtype=np.uint16 if dtype == "bf16" else np.float32, chunks=(rows, self.hidden), **opts)
        self.hiddens.attrs["dtype"] = _text(dtype)
        self.routing_shape = None
        if routing is not None:
            layers, top_k, experts = (int(x) for x in routing)
            if min(layers, top_k, experts) < 1 or experts >= 2**31:
                raise ValueError(f"{path}: routing of {layers} layers, top_k {top_k}, {experts} experts "
                                 "(each must be >= 1)")
            self.routing_shape = (layers, top_k, experts)
            self.routing = self.f.create_dataset(
                "routing", shape=(0, layers * top_k), maxshape=(None, layers * top_k), dtype=np.int32,
                chunks=(max(1, (64 << 10) // (4 * layers * top_k)), layers * top_k), **opts)
            for key, value in zip(("layers", "top_k", "experts"), self.routing_shape):
                self.routing.attrs[key] = np.int64(value)

    def set_attr(self, key: str, value) -> None:
        if isinstance(value, bool):
            self.f.attrs[key] = np.int64(int(value))
        elif isinstance(value, (int, np.integer)):
            self.f.attrs[key] = np.int64(value)
        elif isinstance(value, (float, np.floating)):
            self.f.attrs[key] = np.float64(value)
        else:
            self.f.attrs[key] = _text(value)

    def add(self, tokens, hiddens, prompt_length: int, routing=None) -> None:
        """tokens int [L]; hiddens float [L, hidden] (float32 or wider; BF16 storage rounds them
        to nearest even); prompt_length: the leading prompt positions; routing (when the trace
        records it) int [L, layers, top_k] or [L, layers x top_k]."""
        s = len(self.prompt_lengths)
        tokens = np.asarray(tokens)
        hiddens = np.asarray(hiddens, dtype=np.float32)
        L = int(tokens.shape[0]) if tokens.ndim == 1 else -1
        if L < 0:
            raise ValueError(f"{self.path}: sequence {s}: tokens must be 1-D, got shape {tokens.shape}")
        if hiddens.shape != (L, self.hidden):
            raise ValueError(f"{self.path}: sequence {s}: hiddens have shape {hiddens.shape}, "
                             f"expected ({L}, {self.hidden})")
        if not 2 <= prompt_length <= L:
            raise ValueError(f"{self.path}: sequence {s}: prompt length {prompt_length} must be in "
                             f"[2, {L}] (row 0 pairs token 1 with hidden 0)")
        bad = np.nonzero((tokens < 0) | (tokens >= self.vocab))[0]
        if bad.size:
            t = int(bad[0])
            raise ValueError(f"{self.path}: sequence {s}, position {t}: token id {int(tokens[t])} is "
                             f"outside [0, {self.vocab})")
        ids = self._routing_of(s, L, routing)
        stored = to_bf16_bits(hiddens) if self.dtype == "bf16" else hiddens
        check = bf16_round(hiddens) if self.dtype == "bf16" else hiddens
        nonfinite = np.argwhere(~np.isfinite(check))
        if nonfinite.size:
            t, j = (int(x) for x in nonfinite[0])
            raise ValueError(f"{self.path}: sequence {s}, position {t}, element {j}: hidden is "
                             f"{check[t, j]} (not finite{' after BF16 rounding' if self.dtype == 'bf16' else ''})")
        n0 = self.offsets[-1]
        self.tokens.resize((n0 + L,))
        self.tokens[n0:] = tokens.astype(np.int32)
        self.hiddens.resize((n0 + L, self.hidden))
        self.hiddens[n0:] = stored
        if ids is not None:
            self.routing.resize((n0 + L, ids.shape[1]))
            self.routing[n0:] = ids
        self.offsets.append(n0 + L)
        self.prompt_lengths.append(int(prompt_length))

    def _routing_of(self, s: int, L: int, routing):
        """routing as [L, layers x top_k] int32, checked; None when the trace records none."""
        if self.routing_shape is None:
            if routing is not None:
                raise ValueError(f"{self.path}: sequence {s}: routing given, but the trace records none "
                                 "(TraceWriter(routing=(layers, top_k, experts)))")
            return None
        layers, top_k, experts = self.routing_shape
        if routing is None:
            raise ValueError(f"{self.path}: sequence {s}: the trace records routing; add(..., routing=) is required")
        ids = np.asarray(routing)
        if ids.size != L * layers * top_k or ids.shape[0] != L:
            raise ValueError(f"{self.path}: sequence {s}: routing of shape {ids.shape} for {L} positions of "
                             f"{layers} layers x top_k {top_k}")
        ids = ids.reshape(L, layers, top_k)
        dense = (ids == -1).all(axis=2, keepdims=True)
        bad = np.argwhere(~dense & ((ids < 0) | (ids >= experts)))
        if bad.size:
            t, layer, j = (int(x) for x in bad[0])
            raise ValueError(f"{self.path}: sequence {s}: routing of position {t}, layer {layer}: expert id "
                             f"{int(ids[t, layer, j])} is outside [0, {experts}) (a dense layer's slots are all -1)")
        return ids.reshape(L, layers * top_k).astype(np.int32)

    def commit(self) -> None:
        if not self.prompt_lengths:
            raise ValueError(f"{self.path}: a trace needs at least one sequence")
        self.f.create_dataset("seq_offsets", data=np.asarray(self.offsets, np.int64))
        self.f.create_dataset("prompt_lengths", data=np.asarray(self.prompt_lengths, np.int32))
        self.f.attrs["num_sequences"] = np.int64(len(self.prompt_lengths))
        self.f.close()
        os.replace(self.tmp, self.path)

    def abandon(self) -> None:
        """Closes and removes the temporary file (after an error)."""
        try:
            self.f.close()
        finally:
            if os.path.exists(self.tmp):
                os.remove(self.tmp)
