"""PackedTensorDataset: exact round trip, views, and clear errors."""

import pickle

import pytest
import torch

import ddpbench
from ddpbench.data.packed import PackedTensorDataset, pack_tensors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.uint8, torch.bool,
                                   torch.bfloat16])
def test_round_trip_variable_sizes_and_empty_samples(dtype):
    gen = torch.Generator().manual_seed(0)
    shapes = [(3, 4), (0,), (5,), (2, 0, 3), (), (1, 2, 3, 4), (7,)]
    tensors = [(torch.randn(s, generator=gen) * 10).to(dtype) for s in shapes]
    packed = pack_tensors(tensors)
    assert len(packed) == len(tensors)
    for i, original in enumerate(tensors):
        got = packed[i]
        assert got.dtype == dtype and got.shape == original.shape
        assert torch.equal(got, original)
    back = packed.to_list()
    assert all(torch.equal(a, b) and a.shape == b.shape for a, b in zip(back, tensors))
    assert packed[-1].shape == (7,) and torch.equal(packed[-1], tensors[-1])


def test_items_are_views_of_one_storage():
    packed = pack_tensors([torch.zeros(2, 2), torch.zeros(3)])
    item = packed[1]
    assert item.untyped_storage().data_ptr() == packed.data.untyped_storage().data_ptr()
    item.fill_(5)
    assert packed.data.tolist() == [0, 0, 0, 0, 5, 5, 5]


def test_pickle_round_trip_and_public_name():
    assert ddpbench.PackedTensorDataset is PackedTensorDataset
    packed = ddpbench.pack_tensors([torch.arange(3.0), torch.arange(4.0).view(2, 2)])
    assert "_views" not in packed.__getstate__()  # the per-sample views are not pickled
    again = pickle.loads(pickle.dumps(packed))
    assert torch.equal(again[1], torch.arange(4.0).view(2, 2))
    assert again[1].untyped_storage().data_ptr() == again.data.untyped_storage().data_ptr()


@pytest.mark.parametrize("shapes", [[(3, 4, 4)] * 5, [(3, 4), (5,), (0,), (), (2, 1, 3)]],
                         ids=["one-shape", "mixed-shapes"])
def test_items_are_list_like_views(shapes):
    """ds[i] behaves like list_of_tensors[i]: any integer index (negative, numpy, 0-d tensor), the
    same view object every time, and the element i of a list for every i."""
    import numpy as np

    tensors = [torch.arange(float(torch.Size(s).numel())).view(s) + 100 * i for i, s in enumerate(shapes)]
    packed = pack_tensors(tensors)
    for i in range(-len(tensors), len(tensors)):
        assert packed[i].shape == tensors[i].shape and torch.equal(packed[i], tensors[i])
    assert packed[np.int64(1)] is packed[1] and packed[torch.tensor(2)] is packed[2]
    with pytest.raises(IndexError, match=f"index {len(tensors)} out of range for {len(tensors)} samples"):
        packed[len(tensors)]
    with pytest.raises(TypeError, match="indices must be integers, got float"):
        packed[1.0]


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match="at least one"):
        pack_tensors([])
    with pytest.raises(ValueError, match="pack each dtype separately"):
        pack_tensors([torch.zeros(2), torch.zeros(2, dtype=torch.int32)])
    with pytest.raises(TypeError, match="not a tensor"):
        pack_tensors([torch.zeros(2), [1, 2]])
    packed = pack_tensors([torch.zeros(2)])
    with pytest.raises(IndexError, match="out of range"):
        packed[1]
    with pytest.raises(ValueError, match="offsets must start at 0"):
        PackedTensorDataset(torch.zeros(3), torch.tensor([0, 2]), torch.tensor([[2]]), torch.tensor([1]))
