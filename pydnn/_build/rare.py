"""Which kernel instantiations the install-time build leaves to first use.

`pip install` compiles the instantiations that the planners choose for the data types of deep learning
(float, half, bfloat16) with the default tuning switches. The rest compile on first use, once per arch,
with one log line (`pydnn: compiling kernel unit <unit>.rare for sm_90 ...`), into the same cache; after
that they load like any other. `python -m pydnn build --all` (or PYDNN_BUILD_ALL=1 during the install)
compiles them up front.

Each rule names the family units it looks at (a regular expression matched against the whole unit name)
and the instantiations (a regular expression searched in the name expression) with the reason. A family
unit with rare instantiations is split into two units: the rest under its own name, and `<name>.rare`
(install=False, home=<name>); the loader finds an expression's unit through `home`, so planners and
handle.function keep naming the family's unit. tests/kernels/test_rare_cpu.py checks that every rule
still matches something and that the split loses no instantiation.
"""
import re
from collections import namedtuple
from dataclasses import replace

# below: the rule applies only to device archs whose number is below it (90: Ampere and Ada, where the
# planners never choose what it names, e.g. thread-block-cluster kernels); 0 = every arch. at: the rule
# applies only to device archs of these numbers ((90,): Hopper, where the planners take wgmma kernels in
# place of what it names; on other archs, Blackwell's included, those stay the main path); () = every arch.
# least: only to archs of at least this number (90: where the planners take a cluster form instead); 0 = every
# arch. together: the first use of one of the rule's first-use units compiles all of them of that data type (the same
# family units' last name part) at once, in parallel (loader.load_unit): a model takes most of them together, and one
# at a time they would stall its first step for their sum.
Rule = namedtuple("Rule", "units exprs why below at least together", defaults=(0, (), 0, False))

_INT = r"(signed char|unsigned char|int|pydnn::i64)"

RULES = (
    # --- data types outside deep learning's: double, and the integer types of TransformTensor / SetTensor
    Rule(r"[a-z_]+\.f64|tensor_ops\.transform\.f64", r"",
         "double data: every family's double instantiations (numerics checks, not training or inference)"),
    Rule(r"tensor_ops\.(i8|u8|i32|i64)|tensor_ops\.transform\.(i8|u8|i32|i64)", r"",
         "integer tensors: SetTensor on them and TransformTensor from them"),
    Rule(r"tensor_ops\.transform\.(f32|h16)", r"<[^<>]*, (double|" + _INT[1:-1] + r"), ",
         "TransformTensor from a float type to double or an integer type (quantization paths are rare "
         "enough to pay one compile)"),
    # --- instantiations only a forced tiling or a non-default tuning switch runs (benchmarks, tests)
    Rule(r"convolution\.wgmma\.(f16|bf16)", r"fwd_wgmma<[^,]+, (64, 4, 2|128, 4, 1)(, 0, 1)?>$",
         "fwd_wgmma's plain copy loop (tensor_core.WGM_VARIANTS): only tuning.conv.TC_FORCE runs it"),
    # Backward data on fwd_tma (tuning.conv.DGRAD_TMA, on; session 32): its 6 units cost what the forward's twins do
    # (tools/build_stats.py, this host: bn64 1.0 / 1.0, bn128 2.4 / 2.8 and 3.5 / 3.4, bn256 6.9 / 8.6 and 9.1 CPU s,
    # dgrad / forward), ~47 model s: installed, the 2-core replay predicted 319 s against issue 21's 300 (main: 299).
    # A training job's first backward data on them compiles its data type's widths at once, in parallel (the longest,
    # bn256, ~9 CPU s), then they are cached; `python -m pydnn build --all --only convolution.tma_dgrad` ahead.
    Rule(r"convolution\.tma_dgrad\.bn(64|128|256)\.(f16|bf16)", r"",
         "backward data on fwd_tma (tuning.conv.DGRAD_TMA): ~47 model s of a 2-core install that issue 21's 300 s "
         "budget has no room for; the first training step compiles a data type's widths at once, in parallel",
         together=True),
    Rule(r"convolution\.tma_phase\.bn(64|128|256)\.(f16|bf16)", r"",
         "fwd_tma<..., BKN = 2>: a strided backward data's phases on fwd_tma (tuning.conv.DGRAD_TMA_PHASES, on where "
         "the phase's tiles are >= 0.9 full; session 33): ~35 model s more than the budget holds"),
    # The forward's 256-wide tile (session 33): the 16-byte store (tuning.conv.FWD_TMA_WIDE, 2.1-3.0x on memory-bound
    # layers) made its two units 1.21x dearer (NVRTC CPU s on this host, back to back: 6.8 -> 8.25), the 2-core replay
    # 298 -> 300.4 s against issue 21's 300. bf16's stays installed (training's type; the replay 293.5 s); half's
    # compiles on first use (~8 CPU s, once a machine) for a plan on the 256-wide tile (K >= 256 with few waves, or a
    # short reduction with many items), or `python -m pydnn build --all --only convolution.tma` ahead.
    Rule(r"convolution\.tma\.f16\.bn256", r"",
         "fwd_tma's 256-wide tile for half: ~19 model s of a 2-core install that issue 21's 300 s budget has no room "
         "for since the 16-byte store (bf16's and the 64- / 128-wide tiles are installed)"),
    Rule(r"convolution\.wgrad\.(f16|bf16)", r"wgrad_tc_wgmma<[^,]+, (128, 128, 4, 1, 1|64, 128, 4, 2, 1)>$",
         "wgrad_tc_wgmma's V 1 copy loop (wgrad_wgmma.VARIANTS): only a forced tiling runs it"),
    Rule(r"convolution\.(f16|bf16)", r"::wgrad_tc<",
         "wgrad_tc: the backward filter takes wgrad_pipe_tc (tuning.conv.WG_PIPE) unless dy is not packed NHWC "
         "or spans 2^31 elements (problem.wgp_refusal), or a forced tiling names it"),
    Rule(r"batchnorm\.(f32|f16|bf16)", r"::nc_res<[^<>,]+, \d+, (true|false), true>$",
         "nc_res's streaming form loading 4 elements a step (the template's default SU): only "
         "tuning.batchnorm.NC_RES_SU = 4 runs it (the default, 1, was faster on both measured points)"),
    Rule(r"normalization\.(f32|f16|bf16)", r"::fwd_persist<",
         "fwd_persist: tuning.norm.FWD_PERSIST is off by default"),
    Rule(r"normalization\.(f32|f16|bf16)", r"::finish<32, 8>$",
         "finish<32, 8>: only tuning.norm.FINISH = (32, 8) runs it (the default is (32, 32))"),
    # --- modes and layouts that a planner chooses, but that deep-learning models rarely ask for
    Rule(r"activation\.(f32|h16)", r"::act::(ClippedRelu|Elu|Identity)(Bwd)?<",
         "CLIPPED_RELU, ELU and IDENTITY activations"),
    Rule(r"activation\.h16", r"::act::Tanh<false>|::act::Tanh<true>, \d+, \d+, 2, ",
         "16-bit TANH forward's other forms: tanhf (tuning.activation.TANH_FAST off) and two vectors a thread "
         "(TANH_ELEMS 16)"),
    Rule(r"activation\.(f32|h16)", r"map_strided<",
         "activations of non-dense tensors (map_strided). (The scalar map_contig is installed: a dense plan looks "
         "it up with its vector kernel, pydnn/ops/_elementwise.py)"),
    Rule(r"tensor_ops\.(f32|h16)", r"::tensor::Op(Min|Max|Sqrt|Not),",
         "OpTensor's MIN, MAX, SQRT and NOT"),
    Rule(r"reduce\.(f32|h16)", r"<[^<>]*, (1|6|8), (true|false)>$|, true>$",
         "ReduceTensor's MUL, NORM1 and MUL_NO_ZEROS, and the indices of MIN / MAX / AMAX"),
    Rule(r"softmax\.f32", r"_(fwd|bwd)<[^<>]*, 0>$",
         "float softmax's FAST mode (no max subtraction; frameworks use ACCURATE and LOG). 16-bit ACCURATE runs "
         "the kind-0 kernel itself (softmax.fwd_kind): installed"),
    Rule(r"matmul\.(f16|bf16)\.tt", r"",
         "matmul with both operands transposed (A^T B^T: training's products are NN, NT and TN)"),
    Rule(r"matmul\.wgmma\.(f16|bf16)|matmul\.f32(big)?", r", true, true(, \d+, \d+)?>$",
         "matmul with both operands transposed (A^T B^T: training's products are NN, NT and TN)"),
    # (gemm_tc's element-by-element copies for operands not 16-byte aligned, TC_GENERAL's 64x64, are installed:
    # 16-bit NCHW convolutions whose H x W is not a multiple of 8 run their GEMM on it, e.g. ResNet's 14 x 14
    # and 7 x 7 stages at batch 1 under autocast: tests/kernels/test_install_choices_cpu.py)
    Rule(r"attention\.(dropx\.)?(f16|bf16)", r"::(fwd<[^<>]*|bwd_dq<[^<>]*|bwd_dkdv<[^<>]*, (true|false)), true>$",
         "the mma.sync attention kernels with dropout on P (attention dropout is off in most models; "
         "attention.dropx.<tag>: head dims 96 and 256 with dropout)"),
    # --- algorithms a caller names, which no heuristic ranks first
    Rule(r"rnn_persist(_r)?\.(f32|f16|bf16)", r"",
         "PYDNN_RNN_ALGO_PERSIST_STATIC's persistent kernels: an algorithm the caller asks for by name (STANDARD is "
         "the default, and what pydnn.torch's RNN modules use); its first use compiles its few kernels"),
    Rule(r"conv_fft\.(f32|f16|bf16)", r"",
         "the FFT convolution (FFT / FFT_TILING): Get..._v7 ranks it first on none of the common layers of "
         "tests/kernels/test_install_choices_cpu.py; a Find (benchmark mode) or an explicit algo compiles it"),
    Rule(r"conv_winograd\.(f16|bf16)", r"::conv_wino::[a-z_]+<[^,]+, 2>$",
         "Winograd F(2x2, 3x3) in half / bfloat16 (WINOGRAD_NONFUSED takes F(4x4) there; Find or a forced tile runs "
         "F(2x2))"),
    # --- convolution tilings no common layer takes (tests/kernels/test_install_choices_cpu.py's layers and a
    # scan of ResNet-50, MobileNet-v2, EfficientNet-B0, VGG-16, UNet and ResNeXt layers at N 1 / 8 / 32 / 128,
    # 16-bit NCHW and NHWC, all three directions; the model's choice is by size, so a rarer shape compiles its tile
    # on first use)
    Rule(r"convolution\.(f16|bf16)", r"::(fwd_tc|bwd_data_tc)<[^,]+, 64, 128>$",
         "fwd_tc / bwd_data_tc's 64x128 tile: the model takes 128x64, 128x128 or 64x64 on every scanned layer"),
    Rule(r"convolution\.(f16|bf16)", r"::wgrad_pipe_tc<[^,]+, 128, 128, ",
         "wgrad_pipe_tc's 128x128 tile: the model takes 64x128 or 128x64 on every scanned layer"),
    # --- a model family's own kernels, traded for install time (issue 21: <= 300 s on 2 cores)
    # Grouped convolutions (groups > 1 with C/g >= 2: ResNeXt, RegNet; depthwise is not on these kernels) compile
    # on first use: the packed supergroups (convolution.grouped.*), the direct kernels (gdirect1 / gdirect2) and
    # the direct backward filter (gwgrad): the 2-core build's replay (tools/build_stats.py --model) ends 40.1
    # model s earlier than with session 29's finer rules for them, ~-29 s (~334 s predicted for main before:
    # tools/notes/install.md, session 32); a ResNeXt / RegNet user's first grouped layers compile their chunks
    # instead (one log line each, then cached), or
    # `python -m pydnn build --only convolution.grouped,convolution.gdirect,convolution.gwgrad` ahead. (Session
    # 29's finer rules, the tiles no scanned grouped layer took, are in git history should they come back.)
    Rule(r"convolution\.(grouped|gdirect[12]|gwgrad)\.(f16|bf16)", r"",
         "grouped convolutions (ResNeXt, RegNet: groups > 1 with C/g >= 2): a model family's own kernels, ~29 s "
         "of a 2-core install; their first use compiles them (all of a data type at once, in parallel)",
         together=True),
    # --- Hopper: what the planners leave for the wgmma / warp-specialized kernels on sm_90 (default switches)
    Rule(r"convolution\.(f16|bf16)", r"::implicit_gemm_pipe_tc<1, [^,]+, 128, 128, |::wgrad_pipe_tc<",
         "the mma.sync pipelined kernels that fwd_wgmma / wgrad_tc_wgmma replace on sm_90: the 128x128 backward-data "
         "tile (fwd_wgmma takes every layer with 4 or more K tiles; the 1-3 K tile layers left take 128x64) and "
         "wgrad_pipe_tc (wgrad_tc_wgmma takes every scanned backward filter); installed on other archs. (The 128x128 "
         "forward stays: ConvolutionBiasActivationForward runs 1x1 layers on it, tests/kernels/"
         "test_install_choices_cpu.py)", at=(90,)),
    Rule(r"attention\.ws_bwd\.(f16|bf16)", r"::bwd_ws<[^,]+, \d+, ((1|2|3|4), |\d+, 3>$)",
         "bwd_ws's red / bulk / redpp / bulkw dQ modes and its 3-stage rings: tuning.attention_bwd.WS_DQ's other "
         "values and WS_STAGES 3 (the defaults run \"bulkwpp1\", \"bulkwpp\" under a causal mask at d 128 "
         "(WS_DQ_CAUSAL), and \"none\" when deterministic, on 2 stages)"),
    Rule(r"attention\.ws_bwd\.(f16|bf16)", r"::bwd_ws_var<",
         "bwd_ws's probes (VAR != 0): only tuning.attention_bwd.WS_VAR runs them"),
    Rule(r"attention\.(d96\.)?(f16|bf16)", r"::(fwd|bwd_dq|bwd_dkdv)<",
         "the mma.sync attention forward / backward at head dims 64, 96, 128 without dropout: on sm_90 the "
         "warp-specialized (d 64 / 128) and wgmma (d 96) forwards and the wgmma backward take them "
         "(tuning.attention.ENABLED / WS, attention_bwd.ENABLED off runs them); bwd_pre / bwd_dq_convert stay",
         at=(90,)),
    Rule(r"attention\.d256\.(f16|bf16)", r"::fwd<",
         "the mma.sync attention forward at head dim 256 without dropout: the warp-specialized forward takes it "
         "on sm_90 (its mma.sync backward stays installed: bwd_ws256 leaves dropout, per-batch lengths and the "
         "deterministic dQ to it)", at=(90,)),
    Rule(r"attention\.wgmma\.(d256\.)?(f16|bf16)", r"",
         "the older wgmma attention forward at head dims 64, 128, 256: only tuning.attention.WS off runs it "
         "(the warp-specialized forward takes those dims; d 96 stays on it)"),
    Rule(r"attention\.ws\.(n176|n192)\.(f16|bf16)", r"",
         "the warp-specialized forward's wide key tiles (176 keys at d128, 192 at d64): tuning.attention "
         "WS_BN176 / WS_BN192 are off (benchmark candidates; no measured gain)"),
    Rule(r"attention\.ws\.(emu|rot|cl|xu)\.(f16|bf16)", r"",
         "the warp-specialized forward's benchmark variants: polynomial exp2 (tuning.attention WS_EMU, used only "
         "with WS_C3 off), rotated key order (WS_ROT), 2-CTA K / V multicast (WS_CL) and cross-unit issue (WS_XU); "
         "each measured no better than the defaults (tools/PERF.md, Session 30: attnf)"),
    Rule(r"attention\.(ws|dec)\.paged\.(f16|bf16)", r"",
         "paged K / V (an inference server's page tables): only attention_forward_paged and the graph's paged "
         "sdpa run them"),
    Rule(r"attention\.ws\.(f16|bf16)", r"",
         "the warp-specialized forward at d 64 / 128 with one Q buffer: tuning.attention.WS_Q2 (on) takes two "
         "(attention.ws.q2, and at d 64 with TMA the ghost-tile kernel); only WS_Q2 off runs it (d 256's own unit, "
         "attention.ws.d256, stays)"),
    Rule(r"attention\.ws\.q2\.(f16|bf16)", r"::fwd_ws_tma<[^,]+, 64, 128, 2, true, 2>$",
         "the d 64 TMA forward on two consumer warpgroups with exact exponentials: WS_C3 (on) runs d 64 on three, "
         "with ghost tiles (attention.ws.gh); only WS_C3 off with WS_EMU's d 64 entry at 0 runs it (the cp.async d 64 "
         "kernel, for calls TMA refuses: per-batch key lengths, stays)"),
    Rule(r"attention\.ws\.c3\.(f16|bf16)", r"",
         "fwd_ws_tma on three consumer warpgroups without ghost tiles (d 64): tuning.attention.WS_GH's d 64 entry "
         "(\"all\") sends every such call to the ghost-tile kernel (attention.ws.gh); only WS_GH without d 64 runs it"),
    Rule(r"attention\.ws\.gh\.(f16|bf16)", r"::fwd_ws_tma<[^,]+, 64, [^<>]*, 3, false, true>$",
         "the d 64 ghost-tile kernel without end-aligned blocks: tuning.attention.WS_AL (on) takes the aligned one; "
         "only WS_AL off runs it"),
    Rule(r"attention\.ws\.bf16", r"::fwd_ws<[^<>]*, false>$",
         "fwd_ws without ping-pong (d 128 bf16): attention_ws.PINGPONG, a benchmark knob, runs it"),
    Rule(r"matmul\.wgmma\.(f16|bf16)", r"::gemm_wgmma<[^,]+, 256, ",
         "gemm_wgmma's 128x256 tile one block a tile: tuning.matmul.WG_PERSIST (on) runs its persistent form "
         "(matmul.wgmmap) in its place"),
    Rule(r"matmul\.tmac\.bf16", r"",
         "matmul.TMA_CANDIDATES (gemm_tma_c, 2-CTA clusters): measured on the device, never chosen"),
    Rule(r"matmul\.(wgmmas|wgmmap|tma)\.(f16|bf16)",
         r"::gemm_wgmma_s<[^<>]*, true, true>$|::gemm_wgmma_p<[^<>]*, true, true, \d+, (true|false)>$"
         r"|::gemm_tma<[^<>,]+, \d+, \d+, true, true(, true)?>$",
         "matmul with both operands transposed (A^T B^T: training's products are NN, NT and TN)"),
    Rule(r"normalization\.(f32|f16|bf16)", r"_cluster<|::bwd_ring_cl<|::gn_(fwd|bwd|reg_cl)<",
         "thread-block-cluster norm kernels (fwd / bwd / bwd_staged _cluster, bwd_ring_cl, gn_fwd, gn_bwd, "
         "gn_reg_cl): the planners take them on sm_90 and later only", below=90),
    Rule(r"normalization\.(f16|bf16)", r"::bwd_ring<",
         "bwd_ring with clusters of 1: on sm_90 and later the planner takes BWD_RING_PICK's clusters of 2 "
         "(bwd_ring_cl); older archs take this one", least=90),
    Rule(r"normalization\.f32", r"::bwd(_cluster)?<float, 4, ",
         "the float register-tile backward at the vector width (bwd / bwd_cluster<float, 4>): the staged backward "
         "(tuning.norm.STAGED_BWD, on) takes the same set sizes (4 vectors a thread against 2) and parameter "
         "counts, so only STAGED_BWD off runs it"),
    Rule(r"normalization\.(f16|bf16)", r"::bwd<[^<>]*, 8, ",
         "the 16-bit register-tile backward without clusters: on sm_90 and later the staged backward's "
         "clusters take every set size it serves (bwd_cluster stays for the sets past them)", least=90),
    Rule(r"normalization\.(f16|bf16)", r"::fwd_rows<[^<>]*, false>$",
         "fwd_rows without ONE: ROWS_PICK takes the one-pass statistics for 16-bit rows; only a forced config "
         "runs it"),
    Rule(r"normalization\.(f16|bf16)", r"::bwd_rows<[^<>]*, 2, 2>$",
         "bwd_rows at depth 2: BWD_ROWS_PICK takes depth 3; only a forced config runs it"),
    Rule(r"normalization\.rowx\.(f32|f16|bf16)", r"::(fwd|bwd)_rowx_cl<",
         "thread-block-cluster rowx kernels (fwd_rowx_cl, bwd_rowx_cl): the planner takes them on sm_90 and later "
         "only", below=90),
    Rule(r"normalization_gs\.(f32|f16|bf16)", r"::gs[pcf]_fwd_cl<",
         "thread-block-cluster group-statistics forwards (gsp / gsc / gsf _fwd_cl): the planner takes them on "
         "sm_90 and later only", below=90),
    Rule(r"normalization\.(f32|f16|bf16)", r"::gn_reg_cl<[^<>]*, 4, (true|false)>$",
         "gn_reg_cl with clusters of 4: only tuning.norm.GN_REG_PICK's non-default CL = 4 runs it"),
    # (normalization's vector-width-1 fwd / bwd and gen_fwd / gen_bwd are installed: they are the main path of
    # NHWC group norm whose groups are not whole 16-byte vectors, e.g. GroupNorm(32, 320) in 16-bit, and of
    # sets too large for the tile kernels, e.g. GroupNorm(32, 320) at 128 x 128: tests/kernels/
    # test_install_choices_cpu.py)
    # (vector width 1 is installed for softmax: rows shorter than ROW_VEC_MIN_VECTORS vectors, e.g. a 10-class
    # head, and channel softmax over an odd H x W take it with aligned pointers; for pooling: every NCHW pool
    # takes it, and a plan looks up its unaligned fallback with its main launch; for dropout: its dense plans
    # look up the width-1 kernel beside the vector one. tests/kernels/test_install_choices_cpu.py)
    # (rnn.cu's kernels have no vector width: this rule once matched fwd_cell / bwd_cell<T, 1>, RNN_TANH's cells)
    Rule(r"batchnorm\.(f32|f16|bf16)",
         r"<(float|pydnn::half_t|pydnn::bf16_t), 1(, [^<>]*)?>$",
         "vector width 1: rows or pointers that 16-byte vectors do not fit (odd sizes, unaligned views)"),
    Rule(r"batchnorm\.(f32|f16|bf16)",
         r"::(fwd_stats|fwd_apply|bwd_stats|bwd_apply|infer_rows)<(float, 2|pydnn::(half_t|bf16_t), (2|4))>$",
         "batchnorm's row kernels at a narrower vector (tuning.batchnorm.ROWS_MID): NHWC channel counts that are "
         "not a multiple of the 16-byte vector but of an 8- or 4-byte one"),
    # (batchnorm's *_fused_gen, reduce's rows_gen and softmax's gen_fwd / gen_bwd are installed: small batch
    # norms take fused_gen, e.g. 8 x 64 x 7 x 7 in either layout; reduce and softmax plans look up their
    # general kernel with their main launch, e.g. softmax over a 50257-word vocabulary:
    # tests/kernels/test_install_choices_cpu.py)
)


def arch_number(arch):
    """'sm_90a' -> 90; None or anything else -> None."""
    m = re.fullmatch(r"(?:sm|compute)_(\d+)[a-z]?", str(arch or ""))
    return int(m.group(1)) if m else None


def applies(rule, arch=None):
    """Whether `rule` holds on the device arch `arch` (None: only the rules of every arch hold)."""
    n = arch_number(arch)
    if rule.below and (n is None or n >= rule.below):
        return False
    if rule.least and (n is None or n < rule.least):
        return False
    return not rule.at or n in rule.at


def _compiled(arch=None):
    """The rules that apply to `arch` (None: the rules of every arch only), compiled."""
    return [(re.compile(r.units), re.compile(r.exprs)) for r in RULES if applies(r, arch)]


def is_rare(unit_name, expr, arch=None, _rules=None):
    for u, e in _compiled(arch) if _rules is None else _rules:
        if u.fullmatch(unit_name) and e.search(expr):
            return True
    return False


CHUNK = 4   # rare instantiations per first-use unit at most: a first use compiles a few kernels


_ARG = re.compile(r"[^<>,\s][^<>,]*(?:<[^<>]*>)?")


def group_key(expr):
    """What a first-use unit gathers: the expressions whose non-numeric template arguments are the same
    (one op's or one conversion's layout and vector-width variants: map_contig / map_strided / transpose
    of Relu<true> on half, the tilings of one kernel of one type)."""
    body = expr[expr.find("<") + 1:expr.rfind(">")] if "<" in expr else ""
    args = [a.strip() for a in _ARG.findall(body)]
    return tuple(sorted(a for a in args if not re.fullmatch(r"-?\d+|true|false", a)))


# The archs the default install builds together (build.DEFAULT_ARCHS): an install part that differs between them
# is split into what they all install (the unit's own name: the same instantiations on each, so one NVVM pass
# serves them, pydnn/_build/ptxas.py) and `<name>.a<arch number>`, this arch's own rest (install=True, home=name).
SHARED_ARCHS = ("sm_80", "sm_90")


def _common_part(u, keep, arch):
    """The instantiations of `keep` (u's install part on `arch`) that every SHARED_ARCHS arch installs too, when u
    is a unit whose common part can share one NVVM pass (arch-neutral source, built for every SHARED_ARCHS arch as
    one target); else all of `keep`."""
    if arch is None or u.archs:
        return keep
    others = [a for a in SHARED_ARCHS if arch_number(a) != arch_number(arch)]
    if not others:
        return keep
    rules = {a: _compiled(a) for a in others}
    common = tuple(e for e in keep if not any(is_rare(u.name, e, _rules=rules[a]) for a in others))
    if not common or len(common) == len(keep):
        return keep
    from .ptxas import arch_neutral

    return common if arch_neutral(replace(u, exprs=common)) else keep


def split(units, arch=None):
    """Each unit with rare instantiations on `arch` (None: rare on every arch) as the rest, under its own
    name, and `<name>.rare<i>` units of at most CHUNK rare instantiations each, grouped by group_key; a
    unit whose instantiations are all rare keeps no install part. An arch-neutral unit whose install part
    differs between the SHARED_ARCHS keeps their common part under its name and this arch's rest as
    `<name>.a<arch number>` (_common_part). Units already marked (install=False) are left as they are."""
    rules = _compiled(arch)
    out = []
    for u in units:
        if not u.install:
            out.append(u)
            continue
        rare = tuple(e for e in u.exprs if is_rare(u.name, e, _rules=rules))
        keep = tuple(e for e in u.exprs if e not in rare)
        common = _common_part(u, keep, arch)
        if not rare and common is keep:
            out.append(u)
            continue
        if common is not keep:
            out.append(replace(u, exprs=common))
            out.append(replace(u, name=f"{u.name}.a{arch_number(arch)}", exprs=tuple(e for e in keep if e not in common),
                               home=u.name))
        elif keep:
            out.append(replace(u, exprs=keep))
        groups = {}
        for e in rare:
            groups.setdefault(group_key(e), []).append(e)
        chunks = [g[i:i + CHUNK] for g in groups.values() for i in range(0, len(g), CHUNK)]
        for i, chunk in enumerate(chunks):
            out.append(replace(u, name=f"{u.name}.rare{i}", exprs=tuple(chunk), install=False, home=u.name))
    return out


def together_key(unit):
    """(rule index, data tag) of a first-use unit that a `together` rule made, else None: the units of one key
    compile together at the first use of any of them (loader.load_unit)."""
    if unit.install or not unit.home:
        return None
    for i, r in enumerate(RULES):
        if r.together and re.fullmatch(r.units, unit.home) and all(re.search(r.exprs, e) for e in unit.exprs):
            return i, unit.home.rsplit(".", 1)[-1]
    return None


def unmatched_rules(units):
    """The rules that match no instantiation of `units` (stale after a family changed its names)."""
    bad = []
    for r in RULES:  # (whatever arch the rule is for)
        u, e = re.compile(r.units), re.compile(r.exprs)
        if not any(u.fullmatch(x.name) and e.search(y) for x in units for y in x.exprs):
            bad.append(r)
    return bad
