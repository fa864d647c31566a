"""Train a Gaussian splatting scene on one process or many:

    python examples/simple_trainer.py default --max_steps 300            # built-in scene, 1 process
    torchrun --standalone --nproc_per_node=4 examples/simple_trainer.py default \
        --data_dir data/360_v2/garden --data_factor 4 --result_dir results/garden
    torchrun --standalone --nproc_per_node=4 examples/simple_trainer.py mcmc --strategy.cap_max 1000000

Flags follow gsplat's examples/simple_trainer.py; see --help.
"""

from distsplat.app import main

if __name__ == "__main__":
    main()
