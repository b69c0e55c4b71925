"""Units whose PTX NVRTC writes the same for sm_80 and sm_90 although their sources have __CUDA_ARCH__ paths
(their kernels do not reach them), as verified by `tools/build_stats.py --verify-ptx` (which writes this file):
{unit name: ptxas.digest of the unit then}. A unit here shares one NVVM pass between the archs
(pydnn/_build/ptxas.py) while its digest still matches; an edit of its source, headers or instantiations makes it
compile per arch again until the tool runs again."""
VERIFIED = {
    'attention.bf16': '43c9fa4daddd18bdee724fd7273b540c',
    'attention.d96.bf16': '467e84f8f95e03b3771d1b12153e6ae9',
    'attention.d96.f16': '8d14c78054000f937454630167f6ef1b',
    'attention.dec.bf16': '62001a6840bf1b4fcda49485c82e43cb',
    'attention.dec.f16': 'd43392d11725f7f8c02d026c4c0ad7c9',
    'attention.f16': 'c815d5588fbee2fbe33719fb9928170e',
    'normalization.bf16': 'd9fdedee328bd558031b5118fc029a3a',
    'normalization.f16': '04a3f2ef5aced90c47f34402157d90e5',
    'normalization.f32': '7b72fec6dc0262e6fb3a9e8e88c6be6b',
    'normalization.rowx.bf16': 'd909a8ee2e67b12c7ffaf5aff451a81b',
    'normalization.rowx.f16': 'a7c82cb04f08e80294e3cb5b3e0567cd',
    'normalization.rowx.f32': '609133b159e41478b69f965ab300c175',
    'normalization_gs.bf16': '74821ce2b03d39e06a1318770b07e04c',
    'normalization_gs.f16': '661c1f780a8a739eaf0b9d4fcd895dd2',
    'normalization_gs.f32': '796a9a0c1459d7228eb30f5d8546b391',
}
