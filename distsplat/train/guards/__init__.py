"""train/guards: what stops or protects a run. NaN/Inf steps and save agreements (faults), a full
disk (disk_full), the memory limit (memory), stop signals and the save clock (preemption), a result
dir shared between nodes (shared_dir). Imports nothing else of train/."""
