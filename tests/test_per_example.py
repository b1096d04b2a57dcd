"""The fast per-example gradients used by DP-SGD equal the exact ones (a vmapped backward per
example) on every model family securevfl builds, including a module called twice in one step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from securevfl.models import ConvEncoder, MLPEncoder, TabularEncoder, build_head
from securevfl.per_example import PerExampleTracer


def exact(losses, params):
    g = torch.autograd.grad(losses, params, grad_outputs=torch.eye(len(losses)), is_grads_batched=True,
                            retain_graph=True, allow_unused=True)
    return [torch.zeros((len(losses), *q.shape)) if x is None else x for x, q in zip(g, params, strict=True)]


@pytest.mark.parametrize("family", ["mlp", "cnn", "tabular"])
def test_fast_per_example_gradients_equal_the_exact_ones(family):
    from securevfl.models import ModelConfig

    torch.manual_seed(0)
    b, extra, d = 6, 3, 4
    if family == "mlp":
        bottom, make = MLPEncoder(10, (8,), d), (lambda n: torch.randn(n, 10))
    elif family == "cnn":
        bottom, make = ConvEncoder((8, 6), (3,), d), (lambda n: torch.randn(n, 8, 6))
    else:
        bottom = TabularEncoder(2, (5, 7), 3, (8,), d)
        def make(n):
            return (torch.cat([torch.randn(n, 2), torch.randint(0, 5, (n, 1)).float(),
                                             torch.randint(0, 7, (n, 1)).float()], 1))
    head = build_head(2 * d, 3, ModelConfig(head_hidden=(5,)))
    params = [*bottom.parameters(), *head.parameters()]
    received = torch.randn(b, d, requires_grad=True)  # a passive party's rows (a leaf)
    tracer = PerExampleTracer()
    tracer.arm([bottom, head])
    x, x_extra = make(b), make(extra)
    y, y_extra = torch.randint(0, 3, (b,)), torch.randint(0, 3, (extra,))
    ell = F.cross_entropy(head(torch.cat([bottom(x), received], 1)), y, reduction="none")
    # a second call of the same modules in the same step (FedUD's unaligned rows, no passive input)
    ell_extra = 2.0 * F.cross_entropy(head(torch.cat([bottom(x_extra), torch.zeros(extra, d)], 1)), y_extra,
                                      reduction="none")
    losses = torch.cat([ell, ell_extra])
    fast, leaves = tracer.per_example(losses, params, [received])
    tracer.disarm()
    for f, e in zip(fast, exact(losses, params), strict=True):
        assert torch.allclose(f, e, atol=1e-5)
    assert torch.allclose(leaves[0], torch.autograd.grad(ell.sum(), received, retain_graph=True)[0])
    # control: a per-example gradient from the wrong rows would not match
    assert not torch.allclose(fast[0], exact(losses, params)[0].roll(1, 0), atol=1e-5)


def test_weights_used_outside_their_module_fall_back_to_the_exact_path():
    torch.manual_seed(1)
    lin = torch.nn.Linear(4, 3)
    tracer = PerExampleTracer()
    tracer.arm([lin])
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    # the HE layer's split head reads a slice of the first layer's weight with F.linear
    losses = F.cross_entropy(F.linear(x, lin.weight, lin.bias), y, reduction="none")
    fast, _ = tracer.per_example(losses, list(lin.parameters()), [])
    tracer.disarm()
    for f, e in zip(fast, exact(losses, list(lin.parameters())), strict=True):
        assert torch.allclose(f, e, atol=1e-6)
