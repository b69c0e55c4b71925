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
    'normalization.bf16': '9d4c456b0d8a182d6e483c971c4f8de8',
    'normalization.f16': '4f454c988b08e3db15caacfa53a50135',
    'normalization.f32': 'a7919366a9d708ce6bf91cd552692bfb',
    'normalization.rowx.bf16': '36d39c8c8fc1cf62a7229f4f8635c8c9',
    'normalization.rowx.f16': 'b7dbecabfdf50bf55a71d32eb3773aac',
    'normalization.rowx.f32': 'f3bbaa8ff8c45a3c29787ce1d1551c5e',
    'normalization_gs.bf16': '8862c7a0d9b16a8b01c847816f7facd8',
    'normalization_gs.f16': 'f460bfc0b56be969f8446f01e2defab1',
    'normalization_gs.f32': '48079bbd02d12479cf9fc440b3aa616d',
}
