"""hf_dspark.diagnostics.SyncCounter: counts the host-device sync points a snippet would have on a GPU."""

import torch

from hf_dspark.diagnostics import SyncCounter


def test_counts_each_kind_on_device_tensors_only():
    layer = torch.nn.Linear(3, 3)
    x = torch.randn(2, 3)
    with SyncCounter(layer, x) as counter:
        y = layer(x)  # device work only
        a = y.argmax(-1)
        int(a[0])  # scalar
        bool(y.sum() > 0)  # scalar
        a.tolist()  # tolist
        y[y > 0]  # bool_index
        a.nonzero()  # shape
        a.cpu()  # d2h
        a.to("cpu")  # d2h
        torch.tensor([1, 2], device=x.device)  # h2d
        a.new_tensor([3])  # h2d
        torch.arange(4).to(x.device)  # h2d: a host tensor moved to the device
        host = torch.zeros(2, dtype=torch.long)
        host[:] = a  # d2h: device data written into a host tensor
        # nothing below touches the device
        h = torch.arange(4)
        h.tolist(), int(h[0]), h.nonzero(), h[h > 1]
        a.cpu().tolist()  # one d2h, then a host read
        torch.full((2,), 3, device=x.device) + a  # a device factory: no transfer
        a.to(torch.float64), a[:1], a.view(2, 1)
    assert counter.summary() == {
        "bool_index": 1,
        "d2h": 4,
        "h2d": 3,
        "scalar": 2,
        "shape": 1,
        "tolist": 1,
        "total": 12,
    }


def test_without_roots_every_existing_tensor_is_on_the_device():
    x = torch.randn(4)
    with SyncCounter(record_sites=True) as counter:
        float(x.sum())
        torch.ones(3).tolist()  # made on the host inside the counter
    assert counter.total == 1
    assert counter.events[0].kind == "scalar" and "test_diagnostics.py" in counter.events[0].site


def test_patches_are_undone_and_reset_clears():
    original = torch.Tensor.tolist, torch.tensor, torch.Tensor.to
    counter = SyncCounter()
    with counter:
        torch.randn(2).sum().item()
    assert (torch.Tensor.tolist, torch.tensor, torch.Tensor.to) == original
    counter.reset()
    assert counter.total == 0


def test_non_blocking_upload_is_recorded_but_not_counted():
    x = torch.randn(2)
    with SyncCounter(x) as counter:
        torch.arange(2).to(x.device, non_blocking=True)
    assert counter.total == 0 and counter.counts["h2d_async"] == 1
