"""mmgpg's own saves and loads draw none of transformers' progress bars ("Writing model shards", "Loading
weights"), and leave the user's transformers setting as it was."""

from __future__ import annotations

from transformers.utils import logging as hf_logging

from mmgpg.models.load import load_policy
from mmgpg.models.save import save_policy
from mmgpg.utils import no_transformers_bars


def test_save_and_load_draw_no_transformers_bars(tmp_path, capsys):
    policy = load_policy("tiny:qwen2", dtype="float32", device="cpu")
    capsys.readouterr()
    # the reference: transformers itself draws both bars on stderr (not a terminal here, as in a cluster log)
    policy.model.save_pretrained(tmp_path / "plain")
    type(policy.model).from_pretrained(tmp_path / "plain")
    err = capsys.readouterr().err
    assert "Writing model shards" in err and "Loading weights" in err, err
    save_policy(policy, tmp_path / "ours")
    load_policy(str(tmp_path / "ours"), dtype="float32", device="cpu")
    err = capsys.readouterr().err
    assert "Writing model shards" not in err and "Loading weights" not in err, err
    # afterwards transformers' bars are on again, as they were before
    policy.model.save_pretrained(tmp_path / "again")
    assert "Writing model shards" in capsys.readouterr().err


def test_the_users_hook_and_setting_come_back():
    calls = []

    def users_hook(factory, args, kwargs):
        calls.append(kwargs.get("disable"))
        return factory(*args, **kwargs)

    was_on = hf_logging.is_progress_bar_enabled()
    previous = hf_logging.set_tqdm_hook(users_hook)
    try:
        with no_transformers_bars():
            list(hf_logging.tqdm(range(2), desc="inside"))
        assert calls == [True]  # the user's hook still runs, asked for no bar
        assert hf_logging.set_tqdm_hook(users_hook) is users_hook  # and is the hook again after
        hf_logging.disable_progress_bar()
        with no_transformers_bars():
            pass
        assert not hf_logging.is_progress_bar_enabled()  # a user's "off" stays off
    finally:
        if was_on:
            hf_logging.enable_progress_bar()
        hf_logging.set_tqdm_hook(previous)
