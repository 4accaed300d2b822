"""Training: the RL loop (:mod:`.trainer`: rollout → advantages → update, one step at a time), supervised
fine-tuning (:mod:`.sft`), the resumable prompt stream (:mod:`.stream`), what a run writes as it goes
(:mod:`.runlog`), checkpoints (:mod:`.checkpoint`) and resuming (:mod:`.resume`), plots of a run (:mod:`.plots`) and
the offline CPU demo (:mod:`.demo`).

May import everything below it: the top-level modules, models/, task/, rollout/, backends/, config/, rundir,
evaluation/ and theory/ (the probe). Only cli/ imports train/.
"""
