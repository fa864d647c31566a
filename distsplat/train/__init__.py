"""distsplat.train: one rank's training. The loop and its config live here (config, trainer, the
setup steps, the batch schedule, balancing, batch scaling); the rooms below it hold the model
(model/), the guards (guards/), what a run writes (files/) and the scores (scoring/)
(docs/design.md, "train/ in rooms")."""
