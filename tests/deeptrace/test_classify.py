"""Kernel classification: NCCL/RCCL/HCCL names, memory, sync, compute, the unclassified, and the TOML config."""

from pathlib import Path

import pytest
from deeptrace.classify import ClassifyConfig, KernelClassifier, load_classify_config
from deeptrace.spans import Category


@pytest.mark.parametrize(
    ("name", "cat", "expected"),
    [
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "kernel", Category.COMM),
        ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", "kernel", Category.COMM),
        ("rcclGenericKernel<1, false>", "kernel", Category.COMM),  # RCCL on ROCm
        ("HcclAllReduce_Kernel", "kernel", Category.COMM),  # HCCL on Ascend
        ("hcom_allGather_", "kernel", Category.COMM),
        ("Memcpy DtoH (Device -> Pinned)", "gpu_memcpy", Category.MEMORY),
        ("Memset (Device)", "gpu_memset", Category.MEMORY),
        ("a memory copy named oddly", "gpu_memcpy", Category.MEMORY),
        ("Stream Sync", "cuda_sync", Category.SYNC),
        ("Event Sync", "kernel", Category.SYNC),
        ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>", "kernel",
         Category.COMPUTE),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", "kernel", Category.COMPUTE),
        # Looks like communication but matches no communication pattern: unclassified, not silently compute.
        ("cross_device_allreduce_1stage<bf16>", "kernel", Category.OTHER),
        ("my_nccl_wrapper_copy", "kernel", Category.OTHER),
    ],
)  # fmt: skip
def test_default_classification(name: str, cat: str, expected: Category) -> None:
    assert KernelClassifier().classify(name, cat) is expected


def test_toml_config_replaces_named_lists(tmp_path: Path) -> None:
    path = tmp_path / "classify.toml"
    path.write_text("comm = ['^cross_device_allreduce', '^nccl.*Kernel']\ncompute = ['^sm90_', '^void ']\n")
    classifier = KernelClassifier(load_classify_config(path))
    assert classifier.classify("cross_device_allreduce_1stage<bf16>") is Category.COMM
    assert classifier.classify("sm90_xmma_gemm") is Category.COMPUTE
    assert classifier.classify("Memset (Device)", "gpu_memset") is Category.MEMORY  # default list kept
    # compute narrowed: a kernel that matches nothing is unclassified
    assert classifier.classify("triton_poi_fused_add_0") is Category.OTHER


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ("comm = ['(unclosed']", "invalid regular expression"),
        ("comms = ['^nccl']", "comms"),
        ("comm = [", "invalid TOML"),
    ],
)
def test_bad_config_names_file_and_problem(tmp_path: Path, content: str, fragment: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(content)
    with pytest.raises(ValueError, match=r"bad\.toml") as info:
        load_classify_config(path)
    assert fragment in str(info.value)


def test_default_config_is_valid() -> None:
    assert ClassifyConfig().comm
