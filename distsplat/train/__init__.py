"""distsplat.train: Gaussian parameters and optimizers, densification strategies, losses
and metrics, checkpoints, export and the trainer loop (one rank's view of the training)."""
