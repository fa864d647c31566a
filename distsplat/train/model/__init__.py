"""train/model: what is trained. The Gaussians (activation, initialisation, fused Adam), gsplat's
densification strategies with Gaussian ids, the cameras' pair costs, the image sizes a batch
renders in, and the extras, each a state object of its own: pose corrections, appearance
embeddings, bilateral grids, SfM depth targets. Imports nothing else of train/."""
