"""The evaluation's memory plan (mmgpg.evaluation.budget): generate calls of at most --batch-size sequences, and sizes
that do not fit refused with the size that fits — by hand, and end to end on the issue's command (``mmgpg eval
--samples 100000000 --limit 1`` ended in a 70 GB allocation traceback)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mmgpg.cli import main
from mmgpg.evaluation.budget import GiB, check_generation, check_records, generation_bytes, record_bytes, sample_units


def test_sample_units_never_exceed_the_batch_and_cover_every_sample_once():
    for items, k, batch in ((5, 2, 4), (2, 5, 2), (3, 7, 7), (1, 100, 32), (4, 1, 3)):
        units = sample_units(items, k, batch)
        assert all(n * kc <= max(batch, kc) and kc <= batch for _, n, _, kc in units), units
        covered = sorted((i, s) for start, n, first, kc in units for i in range(start, start + n)
                         for s in range(first, first + kc))
        assert covered == [(i, s) for i in range(items) for s in range(k)]
    assert sample_units(1, 100, 32) == [(0, 1, 0, 32), (0, 1, 32, 32), (0, 1, 64, 32), (0, 1, 96, 4)]
    with pytest.raises(ValueError, match=">= 1"):
        sample_units(1, 0, 4)


def test_records_budget_by_hand():
    # 64 new tokens: 4096 + 16 * 64 = 5120 bytes a record; 4 GiB available -> 2 GiB budget -> 419,430 records
    assert record_bytes(64) == 5120
    check_records(1, 419_430, 64, available=4 * GiB)
    with pytest.raises(ValueError, match=r"--samples 419431 on 1 item\(s\) .* at most --samples 419,430 fits"):
        check_records(1, 419_431, 64, available=4 * GiB)
    with pytest.raises(ValueError, match=r"on 10 item\(s\) .* at most --samples 41,943 fits on 10 item"):
        check_records(10, 10**6, 64, available=4 * GiB)
    with pytest.raises(ValueError, match="not even one sample fits"):
        check_records(10**6, 1, 64, available=GiB)


def test_generation_budget_by_hand():
    # 2 layers, 2 KV heads of 8, vocab 100, bf16: KV 10 seqs x 50 tokens x 2 x 2 (K, V) x 2 x 8 x 2 = 64,000 bytes;
    # logits 10 x 100 x 24 = 24,000 -> 88,000
    text = SimpleNamespace(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                           vocab_size=100, head_dim=8)
    assert generation_bytes(10, 50, text, 2) == 88_000
    check_generation(10, 10, 50, text, 2, available=110_000)  # 80 % of 110,000 = 88,000: fits exactly
    with pytest.raises(ValueError, match=r"--batch-size 11: .* at most --batch-size 10 fits"):
        check_generation(11, 11, 50, text, 2, available=110_000)
    # one sequence of 50 tokens needs 8,800 > 80 % of 10,000: per token 128 bytes, logits 2,400 -> 43 tokens fit
    with pytest.raises(ValueError, match=r"not even one sequence fits: a sequence of at most 43 tokens"):
        check_generation(1, 1, 50, text, 2, available=10_000)


def test_eval_with_a_hundred_million_samples_is_a_clear_refusal(tmp_path, capsys):
    assert main(["eval", "--task", "shapes", "--ckpt", "tiny", "--samples", "100000000", "--limit", "1",
                 "--output", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err
    assert "--samples 100000000 on 1 item(s) keeps 100,000,000 judged records" in err and "at most --samples" in err
    assert main(["eval", "--task", "shapes", "--ckpt", "tiny", "--max-new-tokens", "1000000000", "--limit", "1",
                 "--output", str(tmp_path / "f")]) == 2
    assert "not even one sequence fits" in capsys.readouterr().err
