"""train/files: what a run writes and reads back. The checkpoint format (checkpoint) and the
checkpointer that saves and resumes a dict of state objects (checkpointer), PLY export and the
run's outputs (export, outputs), cameras.json and transform.json (coords), other trainers' models
in and out (model_files, model_import), camera paths and videos (trajectory, video).
Imports train/model and train/guards only."""
