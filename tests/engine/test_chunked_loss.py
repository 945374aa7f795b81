"""The chunked loss (xtrain.loss) against torch's cross-entropy on full logits: values, gradients for the hidden
states and the output weight, normalisation, ignore_index, edge cases, memory, and the weight as FSDP2 and a tied
embedding hand it over."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from xtrain.loss import auto_chunk_tokens, chunked_cross_entropy, full_logits_cross_entropy, peak_allocated_bytes
from xtrain.loss.chunk_size import CPU_BUDGET_BYTES, CUDA_BUDGET_BYTES, chunk_bytes_per_token

T, D, V = 37, 16, 53  # 37 tokens: no chunk size below tests divides it except 1


def make_inputs(
    tokens: int = T, dtype: torch.dtype = torch.float32, ignore_every: int = 5, seed: int = 0
) -> tuple[Tensor, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden_TD = torch.randn(tokens, D, generator=gen).to(dtype).requires_grad_()
    weight_VD = (torch.randn(V, D, generator=gen) * 0.5).to(dtype).requires_grad_()
    labels_T = torch.randint(0, V, (tokens,), generator=gen)
    if ignore_every:
        labels_T[::ignore_every] = -100
    return hidden_TD, weight_VD, labels_T


def reference(
    hidden_TD: Tensor, weight_VD: Tensor, labels_T: Tensor, normaliser: float, ignore_index: int = -100
) -> tuple[Tensor, Tensor, Tensor]:
    """Loss and gradients from torch's F.cross_entropy on the full logits, computed in fp32 from the same values."""
    h = hidden_TD.detach().float().requires_grad_()
    w = weight_VD.detach().float().requires_grad_()
    loss = F.cross_entropy(h @ w.t(), labels_T, ignore_index=ignore_index, reduction="sum") / normaliser
    loss.backward()
    assert h.grad is not None and w.grad is not None
    return loss.detach(), h.grad, w.grad


def chunked_with_grads(
    hidden_TD: Tensor, weight_VD: Tensor, labels_T: Tensor, normaliser: float | Tensor, chunk_tokens: int, **kw: int
) -> tuple[Tensor, Tensor, Tensor]:
    hidden_TD.grad = weight_VD.grad = None
    loss = chunked_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=normaliser, chunk_tokens=chunk_tokens, **kw)
    loss.backward()
    assert hidden_TD.grad is not None and weight_VD.grad is not None
    return loss.detach(), hidden_TD.grad, weight_VD.grad


def target_count(labels_T: Tensor, ignore_index: int = -100) -> float:
    return float((labels_T != ignore_index).sum())


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, 16, 37, 64])
def test_fp32_value_and_gradients_equal_full_logits_cross_entropy(chunk_tokens: int) -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    n = target_count(labels_T)
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n, chunk_tokens)
    ref_loss, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad_h, ref_h, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(grad_w, ref_w, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_inputs_give_16bit_gradients_close_to_the_fp32_reference(dtype: torch.dtype) -> None:
    hidden_TD, weight_VD, labels_T = make_inputs(tokens=96, dtype=dtype)
    n = target_count(labels_T)
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n, chunk_tokens=10)
    ref_loss, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    assert loss.dtype == torch.float32
    assert grad_h.dtype == dtype and grad_w.dtype == dtype
    # Logits rounded to 16 bits by the matmul: loss within ~1e-2; gradients within a few 16-bit ulps of their scale.
    torch.testing.assert_close(loss, ref_loss, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(grad_h.float(), ref_h, rtol=0.0, atol=3e-2 * float(ref_h.abs().max()))
    torch.testing.assert_close(grad_w.float(), ref_w, rtol=0.0, atol=3e-2 * float(ref_w.abs().max()))


def test_bf16_weight_gradient_accumulates_in_fp32_over_many_chunks() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs(tokens=2048, dtype=torch.bfloat16, ignore_every=0)
    n = target_count(labels_T)
    _, _, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n, chunk_tokens=1)
    _, _, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    scale = float(ref_w.abs().max())
    # What summing the 2048 one-token contributions in bf16 would give: drift of several percent of the scale.
    logits_TV = (hidden_TD.detach().float() @ weight_VD.detach().float().t()).requires_grad_()
    (F.cross_entropy(logits_TV, labels_T, reduction="sum") / n).backward()
    assert logits_TV.grad is not None
    bf16_sum_VD = torch.zeros_like(ref_w, dtype=torch.bfloat16)
    for token in range(2048):
        bf16_sum_VD += torch.outer(logits_TV.grad[token], hidden_TD[token].detach().float()).to(torch.bfloat16)
    assert float((bf16_sum_VD.float() - ref_w).abs().max()) > 2**-6 * scale
    # Accumulated in fp32 and rounded once: within bf16's rounding of the logits and of the result.
    assert float((grad_w.float() - ref_w).abs().max()) < 2**-7 * scale


def test_ignore_index_tokens_contribute_nothing() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs(ignore_every=0)
    labels_T[::3] = -1
    n = target_count(labels_T, ignore_index=-1)
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n, chunk_tokens=8, ignore_index=-1)
    ref_loss, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n, ignore_index=-1)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad_h, ref_h)
    torch.testing.assert_close(grad_w, ref_w)
    assert torch.all(grad_h[::3] == 0)


def test_all_ignored_input_and_all_ignored_chunks() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs(ignore_every=0)
    labels_T[:] = -100
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, normaliser=4.0, chunk_tokens=8)
    assert loss.item() == 0.0
    assert torch.all(grad_h == 0) and torch.all(grad_w == 0)

    # Ignored tokens filling whole chunks in the middle of an otherwise normal input.
    hidden_TD, weight_VD, labels_T = make_inputs(ignore_every=0)
    labels_T[8:24] = -100
    n = target_count(labels_T)
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n, chunk_tokens=8)
    ref_loss, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    torch.testing.assert_close(loss, ref_loss)
    torch.testing.assert_close(grad_h, ref_h)
    torch.testing.assert_close(grad_w, ref_w)


def test_zero_tokens() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs(tokens=0)
    loss, grad_h, grad_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, normaliser=3.0, chunk_tokens=8)
    assert loss.item() == 0.0
    assert grad_h.shape == (0, D) and torch.all(grad_w == 0)


def test_two_halves_with_the_global_normaliser_add_up_to_the_whole() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    n_global = target_count(labels_T)
    whole_loss, whole_h, whole_w = chunked_with_grads(hidden_TD, weight_VD, labels_T, n_global, chunk_tokens=8)
    whole_h, whole_w = whole_h.clone(), whole_w.clone()

    h = hidden_TD.detach().clone().requires_grad_()
    w = weight_VD.detach().clone().requires_grad_()
    split = 20
    # A tensor normaliser (as an all-reduced count would be) behaves like the number.
    normaliser = torch.tensor(n_global)
    first = chunked_cross_entropy(h[:split], w, labels_T[:split], normaliser=normaliser, chunk_tokens=8)
    second = chunked_cross_entropy(h[split:], w, labels_T[split:], normaliser=normaliser, chunk_tokens=8)
    first.backward()  # accumulates into w.grad, as gradient accumulation over micro-batches does
    second.backward()
    torch.testing.assert_close(first.detach() + second.detach(), whole_loss)
    assert h.grad is not None and w.grad is not None
    torch.testing.assert_close(h.grad, whole_h)
    torch.testing.assert_close(w.grad, whole_w)
    # The unnormalised sum for logging is loss * normaliser.
    torch.testing.assert_close(
        whole_loss * n_global, F.cross_entropy(hidden_TD @ weight_VD.t(), labels_T, reduction="sum").detach()
    )


def test_backward_scales_the_stored_gradients_by_grad_output() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    n = target_count(labels_T)
    _, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    (3.0 * chunked_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=n, chunk_tokens=8)).backward()
    assert hidden_TD.grad is not None and weight_VD.grad is not None
    torch.testing.assert_close(hidden_TD.grad, 3.0 * ref_h)
    torch.testing.assert_close(weight_VD.grad, 3.0 * ref_w)


def test_a_second_backward_through_the_same_forward_is_refused() -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    loss = chunked_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=10.0, chunk_tokens=8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.parametrize("which", ["hidden", "weight"])
def test_only_the_input_that_requires_grad_gets_one(which: str) -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    n = target_count(labels_T)
    _, ref_h, ref_w = reference(hidden_TD, weight_VD, labels_T, n)
    h = hidden_TD.detach().requires_grad_(which == "hidden")
    w = weight_VD.detach().requires_grad_(which == "weight")
    chunked_cross_entropy(h, w, labels_T, normaliser=n, chunk_tokens=8).backward()
    if which == "hidden":
        assert w.grad is None and h.grad is not None
        torch.testing.assert_close(h.grad, ref_h)
    else:
        assert h.grad is None and w.grad is not None
        torch.testing.assert_close(w.grad, ref_w)


def test_no_grad_mode_computes_the_loss_without_gradient_work() -> None:
    gen = torch.Generator().manual_seed(1)
    vocab, hidden = 4096, 128
    hidden_TD = torch.randn(256, hidden, generator=gen, requires_grad=True)
    weight_VD = torch.randn(vocab, hidden, generator=gen, requires_grad=True)
    labels_T = torch.randint(0, vocab, (256,), generator=gen)
    ref_loss, _, _ = reference(hidden_TD, weight_VD, labels_T, 256.0)
    losses: list[Tensor] = []

    def run() -> None:
        with torch.no_grad():
            losses.append(chunked_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=256.0, chunk_tokens=32))

    peak = peak_allocated_bytes(run)
    assert losses[0].grad_fn is None and not losses[0].requires_grad
    torch.testing.assert_close(losses[0], ref_loss)
    # No [V, D] weight-gradient accumulator (2 MiB here) nor hidden gradient: only the [32, V] chunk buffer.
    assert peak < vocab * hidden * 4 // 2
    assert peak >= 32 * vocab * 4

    # Inputs that do not require grad, grad mode on: the same.
    loss = chunked_cross_entropy(hidden_TD.detach(), weight_VD.detach(), labels_T, normaliser=256.0, chunk_tokens=32)
    assert loss.grad_fn is None
    torch.testing.assert_close(loss, ref_loss)


def test_peak_memory_stays_far_below_the_full_logits() -> None:
    gen = torch.Generator().manual_seed(2)
    tokens, vocab, hidden, chunk = 1024, 8192, 32, 64
    hidden_TD = torch.randn(tokens, hidden, generator=gen, requires_grad=True)
    weight_VD = torch.randn(vocab, hidden, generator=gen, requires_grad=True)
    labels_T = torch.randint(0, vocab, (tokens,), generator=gen)
    logits_bytes = tokens * vocab * 4  # 32 MiB
    grads_bytes = (tokens + vocab) * hidden * 4  # the two gradients, held by both losses

    def step(loss_fn: object) -> None:
        hidden_TD.grad = weight_VD.grad = None
        if loss_fn is chunked_cross_entropy:
            loss = chunked_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=tokens, chunk_tokens=chunk)
        else:
            loss = full_logits_cross_entropy(hidden_TD, weight_VD, labels_T, normaliser=tokens)
        loss.backward()

    naive_peak = peak_allocated_bytes(lambda: step(full_logits_cross_entropy))
    chunked_peak = peak_allocated_bytes(lambda: step(chunked_cross_entropy))
    # The measurement sees the full logits when they exist (the naive loss holds two such tensors at its peak) ...
    assert naive_peak >= 2 * logits_bytes
    # ... and the chunked loss holds its gradients plus one [chunk, V] buffer and small per-chunk vectors.
    assert chunked_peak <= grads_bytes + chunk * vocab * 4 + 256 * 1024
    assert chunked_peak < logits_bytes / 8


def test_auto_chunk_size_follows_the_budget() -> None:
    vocab = 151_936
    fp32 = auto_chunk_tokens(vocab, torch.float32)
    assert fp32 * vocab * 4 <= CPU_BUDGET_BYTES < (fp32 + 64) * vocab * 4
    assert fp32 % 64 == 0
    bf16 = auto_chunk_tokens(vocab, torch.bfloat16, device=torch.device("cuda"))
    assert bf16 * vocab * 6 <= CUDA_BUDGET_BYTES < (bf16 + 64) * vocab * 6
    assert auto_chunk_tokens(vocab, torch.float32, budget_bytes=2**20) == 1  # less than one token fits: 1
    assert auto_chunk_tokens(1000, torch.float32, budget_bytes=40 * 4000) == 40  # under 64: not rounded
    with pytest.raises(ValueError, match="float64"):
        auto_chunk_tokens(vocab, torch.float64)
    with pytest.raises(ValueError, match="budget_bytes"):
        auto_chunk_tokens(vocab, torch.float32, budget_bytes=0)


def test_auto_chunk_size_keeps_the_measured_working_set_within_the_budget() -> None:
    gen = torch.Generator().manual_seed(3)
    tokens, vocab, hidden, budget = 512, 4096, 32, 1 << 20
    for dtype in (torch.float32, torch.bfloat16):
        chunk = auto_chunk_tokens(vocab, dtype, budget_bytes=budget)
        assert chunk * chunk_bytes_per_token(vocab, dtype) <= budget
        hidden_TD = torch.randn(tokens, hidden, generator=gen).to(dtype).requires_grad_()
        weight_VD = torch.randn(vocab, hidden, generator=gen).to(dtype).requires_grad_()
        labels_T = torch.randint(0, vocab, (tokens,), generator=gen)

        def step(h: Tensor = hidden_TD, w: Tensor = weight_VD, y: Tensor = labels_T, c: int = chunk) -> None:
            chunked_cross_entropy(h, w, y, normaliser=tokens, chunk_tokens=c).backward()

        peak = peak_allocated_bytes(step)
        # Beyond the budget: the fp32 weight-gradient accumulator, the returned gradients and small vectors.
        returned = (tokens + vocab) * hidden * dtype.itemsize
        assert peak <= budget + vocab * hidden * 4 + returned + 128 * 1024


def test_tied_embedding_weight_gets_both_gradients() -> None:
    gen = torch.Generator().manual_seed(4)
    embed = nn.Embedding(V, D)
    with torch.no_grad():
        embed.weight.copy_(torch.randn(V, D, generator=gen))
    ids_T = torch.randint(0, V, (T,), generator=gen)
    labels_T = torch.roll(ids_T, -1)
    scale = torch.randn(D, generator=gen)

    def loss_of(loss_kind: str) -> Tensor:
        hidden_TD = torch.tanh(embed(ids_T) * scale)  # a stand-in for the decoder, so both uses of the matrix matter
        if loss_kind == "chunked":
            return chunked_cross_entropy(hidden_TD, embed.weight, labels_T, normaliser=T, chunk_tokens=6)
        return F.cross_entropy(hidden_TD @ embed.weight.t(), labels_T, reduction="sum") / T

    loss_of("reference").backward()
    assert embed.weight.grad is not None
    ref_grad = embed.weight.grad.clone()
    embed.weight.grad = None
    loss_of("chunked").backward()
    torch.testing.assert_close(embed.weight.grad, ref_grad)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chunk_tokens": 0}, "chunk_tokens must be a positive integer"),
        ({"normaliser": 0.0}, "normaliser must be positive"),
        ({"weight_VD": torch.randn(V, D + 1)}, "hidden size differs"),
        ({"labels_T": torch.zeros(T + 1, dtype=torch.long)}, "labels must be"),
        ({"weight_VD": torch.randn(V, D, dtype=torch.float64)}, "must share one of"),
        ({"hidden_TD": torch.randn(1, T, D)}, "hidden must be"),
    ],
)
def test_bad_arguments_raise_one_clear_value_error(change: dict[str, object], message: str) -> None:
    hidden_TD, weight_VD, labels_T = make_inputs()
    kwargs: dict[str, object] = {
        "hidden_TD": hidden_TD,
        "weight_VD": weight_VD,
        "labels_T": labels_T,
        "normaliser": 5.0,
        "chunk_tokens": 8,
    }
    kwargs.update(change)
    with pytest.raises(ValueError, match=message):
        chunked_cross_entropy(**kwargs)  # type: ignore[arg-type]


# Each rank holds its own tokens; the output weight is sharded by FSDP2 and unsharded (a plain tensor) for the
# forward, then resharded at once: the chunked loss must not need it in backward.
_FSDP_WORKER = """
import sys
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from xtrain.loss import chunked_cross_entropy

rank, world, init_file, out_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
data = torch.load(f"{out_dir}/inputs.pt")


class OutputHead(nn.Module):
    def __init__(self, weight_VD: torch.Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight_VD.clone())

    def forward(self, hidden_TD: torch.Tensor, labels_T: torch.Tensor, normaliser: float) -> torch.Tensor:
        return chunked_cross_entropy(hidden_TD, self.weight, labels_T, normaliser=normaliser, chunk_tokens=5)


head = OutputHead(data["weight"])
fully_shard(head, reshard_after_forward=True)
hidden_TD = data["hidden"][rank].clone().requires_grad_()
loss = head(hidden_TD, data["labels"][rank], data["normaliser"])
loss.backward()
grad_weight = head.weight.grad.full_tensor()  # FSDP2 averages over ranks by default
torch.save({"loss": loss.detach(), "grad_hidden": hidden_TD.grad, "grad_weight": grad_weight},
           f"{out_dir}/rank{rank}.pt")
dist.destroy_process_group()
"""


@pytest.mark.multiprocess
def test_weight_sharded_by_fsdp2_gets_the_global_gradient(tmp_path: Path) -> None:
    world = 2
    gen = torch.Generator().manual_seed(5)
    hidden = torch.randn(world, T, D, generator=gen)
    weight = torch.randn(V, D, generator=gen)
    labels = torch.randint(0, V, (world, T), generator=gen)
    labels[0, ::4] = -100
    normaliser = float((labels != -100).sum())  # global over both ranks
    torch.save({"hidden": hidden, "weight": weight, "labels": labels, "normaliser": normaliser}, tmp_path / "inputs.pt")
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(_FSDP_WORKER))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(world), str(tmp_path / "init"), str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world)
    ]
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs

    ref_loss, ref_h, ref_w = reference(hidden.reshape(world * T, D), weight, labels.reshape(-1), normaliser)
    results = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(world)]
    torch.testing.assert_close(sum(r["loss"] for r in results), ref_loss)
    torch.testing.assert_close(torch.cat([r["grad_hidden"] for r in results]), ref_h)
    for r in results:
        torch.testing.assert_close(r["grad_weight"] * world, ref_w)
