"""Tuning switches: every knob that changes which kernel, tiling or path a planner picks, in one place.

The planners read these when they make a plan (not per launch), so a change applies to plans made after
it; a handle's cached plans keep what they were made with. The defaults are what the benchmarks in
tools/ chose (the reasons are beside each switch and, in full, in tools/PERF.md). Three ways to set them:

* tests and code: `pydnn.tuning.conv.USE_WGM = False`, pytest's `monkeypatch.setattr(tuning.conv,
  "USE_WGM", False)`, or `with pydnn.tuning.override({"conv.USE_WGM": False}): ...`;
* the environment, read once at import (for benchmarks): `PYDNN_TUNING="conv.USE_WGM=False;
  conv_gemm.COL_LIMIT=1<<20"` (values are Python literals; `;` or `,` between settings);
* `python -m pydnn tuning` lists every switch with its value and what it does.

This module imports nothing else of pydnn: every layer may read it.
"""
import ast
import contextlib
import logging
import os

_log = logging.getLogger("pydnn")


class Switches:
    """One family's switches: plain attributes, documented, resettable to their defaults."""

    def __init__(self, family, doc, **switches):
        object.__setattr__(self, "_family", family)
        object.__setattr__(self, "_doc", doc)
        object.__setattr__(self, "_defaults", {k: v for k, (v, _) in switches.items()})
        object.__setattr__(self, "_docs", {k: d for k, (_, d) in switches.items()})
        for k, (v, _) in switches.items():
            object.__setattr__(self, k, _fresh(v))
        FAMILIES[family] = self

    def __setattr__(self, name, value):
        if name not in self._defaults:
            raise AttributeError(f"pydnn.tuning.{self._family} has no switch {name!r} "
                                 f"(switches: {', '.join(self._defaults)})")
        object.__setattr__(self, name, value)

    def names(self):
        return tuple(self._defaults)

    def reset(self):
        for k, v in self._defaults.items():
            object.__setattr__(self, k, _fresh(v))

    def describe(self):
        lines = [f"{self._family}: {self._doc}"]
        for k in self._defaults:
            lines.append(f"  {self._family}.{k} = {getattr(self, k)!r}   (default {self._defaults[k]!r})")
            lines.append(f"      {self._docs[k]}")
        return "\n".join(lines)


def _fresh(v):
    """A default's own copy (a dict switch such as conv.TC_FORCE is mutated in place by callers)."""
    return dict(v) if isinstance(v, dict) else v


FAMILIES = {}


def _split(name):
    family, _, switch = name.partition(".")
    if family not in FAMILIES or not switch:
        raise KeyError(f"unknown tuning switch {name!r} (families: {', '.join(FAMILIES)})")
    return FAMILIES[family], switch


def get(name):
    fam, switch = _split(name)
    return getattr(fam, switch)


def set(name, value):  # noqa: A001 - the natural verb beside get
    fam, switch = _split(name)
    setattr(fam, switch, value)


@contextlib.contextmanager
def override(settings):
    """Set {"family.SWITCH": value, ...} for the duration of a with block, then restore."""
    saved = {name: get(name) for name in settings}
    try:
        for name, value in settings.items():
            set(name, value)
        yield
    finally:
        for name, value in saved.items():
            set(name, value)


def reset():
    for fam in FAMILIES.values():
        fam.reset()


def describe():
    return "\n\n".join(fam.describe() for fam in FAMILIES.values())


def apply_environment(text=None):
    """Apply PYDNN_TUNING (or `text`): `family.SWITCH=literal` settings separated by ';' or ','."""
    text = os.environ.get("PYDNN_TUNING", "") if text is None else text
    for item in text.replace(",", ";").split(";"):
        if not item.strip():
            continue
        name, eq, value = item.partition("=")
        try:
            if not eq:
                raise ValueError("expected family.SWITCH=value")
            set(name.strip(), ast.literal_eval(value.strip()))
        except (KeyError, ValueError, SyntaxError, AttributeError) as e:
            _log.warning("PYDNN_TUNING: ignoring %r: %s", item.strip(), e)


# ----------------------------------------------------------------------------- convolution

conv = Switches(
    "conv", "the tensor-core implicit GEMMs (pydnn/ops/convolution/tensor_core.py)",
    USE_WGM=(True, "sm_90: the model picks fwd_wgmma (Hopper wgmma) over implicit_gemm_pipe_tc where it "
                   "applies (channels % 64 == 0, >= WGM_MIN_KTILES K tiles a block): 1.11-1.42x on the "
                   "ResNet layers (tools/bench_convolution.py)"),
    WGM_BWD_SWAP=(False, "backward data on fwd_wgmma through filter_kc_swap + the forward even where "
                         "fwd_wgmma reads B straight from the filter (the direct plan: no swap, no "
                         "workspace, 1.05-1.13x the swap on the H100)"),
    WG_PIPE=(True, "the backward filter's model picks wgrad_pipe_tc where it applies (else wgrad_tc)"),
    TC_STAGED_PLAIN=(False, "the plain tensor-core forward through the shared-memory staged epilogue too "
                            "(FLAG_STAGED; the fused bias / z / activation and beta != 0 always take it)"),
    TC_FORCE=({}, "direction -> a tiling used instead of the model's choice: (BM, BN) for fwd_tc / "
                  "bwd_data_tc, a TCP_TILES entry for the pipelined kernels, a WGM_TILES / WGM_VARIANTS "
                  "entry for fwd_wgmma, (BM, splits) for wgrad_tc or (a WGP_TILES entry, splits) for "
                  "wgrad_pipe_tc, (a wgrad_wgmma TILES entry, splits[, full, tail_splits]) for the wgmma "
                  "backward filter; each used where its kernel applies, else the model's choice"),
)

conv_gemm = Switches(
    "conv_gemm", "the explicit-GEMM convolutions (pydnn/ops/convolution/gemm.py)",
    IMPLICIT=(True, "BWD_FILTER_ALGO_3's implicit variant (wgrad_implicit) serves the float problems it "
                    "applies to (<= 160 columns): the fp32 7x7/2 stem 1.23x cuDNN where the explicit GEMMs "
                    "ran 0.65x; off, they take the explicit GEMMs"),
    COL_LIMIT=(256 << 20, "workspace bytes of column matrix (+ packed dy) per chunk of images"),
    PART_LIMIT=(64 << 20, "workspace bytes of partial dw's (per-image plans over it add later chunks "
                          "into the first chunk's partials)"),
    MIN_SPLIT_ROWS=(256, "a backward-filter split's reduction is at least this many rows (shorter ones "
                         "are all epilogue)"),
)

conv_winograd = Switches(
    "conv_winograd", "WINOGRAD_NONFUSED (pydnn/ops/convolution/winograd.py)",
    PREFERRED_TILE=(4, "the output tile m of F(m x m, 3 x 3) (2 or 4): F(4x4) does 4x fewer multiplies "
                       "than direct (F(2x2) 2.25x) for a 2.25x expansion of x and y in the workspace (4x); "
                       "tests pin each tile through this"),
    WGRAD_FORCE_SPLITS=(None, "the backward filter's split S of the tiles (None: the model's choice)"),
    WGRAD_LAYOUT=(None, "the backward filter's U / D layout: 'tile' (tiles fastest) or 'chan' (channels "
                        "fastest, one group); None: channels fastest for NHWC-like x, else tiles"),
)

conv_wgrad_wgmma = Switches(
    "conv_wgrad_wgmma", "the wgmma backward filter (pydnn/ops/convolution/wgrad_wgmma.py)",
    ENABLED=(True, "BWD_FILTER_ALGO_1 on sm_90 takes wgrad_tc_wgmma where it applies"),
    FORCE=(None, "(a TILES / VARIANTS entry, splits[, full, tail_splits]) instead of the model's choice"),
)

apply_environment()
