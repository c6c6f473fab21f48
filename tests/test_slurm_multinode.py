"""Multi-node (issue 37): 2 nodes x 8 GPUs under SLURM, checked without SLURM.

The launcher side: ``python train.py -m hydra/launcher=slurm trainer.devices=8 trainer.num_nodes=2`` composes a
submitit launcher with one task per GPU, and submitting it (a stand-in ``sbatch`` on PATH keeps the script) writes
``#SBATCH --nodes=2 --ntasks-per-node=8 --gpus-per-node=8`` with the preemption signal and ``srun``. The job side:
with the variables SLURM sets for rank 11 of such a job, seqmix's cluster plugin is Lightning's SLURM environment
and a DDP Trainer built the way ``seqmix.cli.train`` builds it is rank 11 of 16; a job whose tasks do not match
``trainer.devices``/``trainer.num_nodes`` is refused.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seqmix.config.resolvers import register_resolvers
from seqmix.config.schema import check_train_config
from seqmix.training.checkpoints import AtomicCheckpointIO
from seqmix.training.preemption import cluster_environment

CONF = Path(__file__).resolve().parents[1] / "conf"
README = Path(__file__).resolve().parents[1] / "README.md"
register_resolvers()

TWO_NODES_OF_EIGHT = ["trainer.devices=8", "trainer.num_nodes=2", "trainer.strategy=ddp"]
# What SLURM sets in task 11 of `sbatch --nodes=2 --ntasks-per-node=8 --gpus-per-node=8` + `srun python train.py`
# (or the same job submitted by submitit): the 4th task of the 2nd node.
RANK_11_OF_16 = {
    "SLURM_JOB_ID": "5123456", "SLURM_JOB_NAME": "seqmix", "SLURM_NTASKS": "16", "SLURM_NTASKS_PER_NODE": "8",
    "SLURM_TASKS_PER_NODE": "8(x2)", "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_PROCID": "11",
    "SLURM_LOCALID": "3", "SLURM_NODEID": "1", "SLURM_NODELIST": "gpu[017-018]", "SLURM_JOB_NODELIST": "gpu[017-018]",
    "SLURMD_NODENAME": "gpu018", "SLURM_CPUS_PER_TASK": "8",
}


def compose_train(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=True)


@pytest.fixture(autouse=True)
def environment_restored():
    """Lightning writes MASTER_ADDR, MASTER_PORT and the like into os.environ itself while it reads SLURM's
    variables; monkeypatch cannot undo what it did not set, and a leaked MASTER_ADDR=gpu017 made a later test's
    two-process DDP run wait for that host forever. The whole environment is put back after every test."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture
def no_cluster(monkeypatch):
    """No SLURM (or torchrun) variables, and whatever Lightning sets while it reads them is undone afterwards
    (``environment_restored``): MASTER_ADDR/MASTER_PORT, the process-wide rank of rank_zero_only, OMP_NUM_THREADS."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "SLURMD_")):
            monkeypatch.delenv(key)
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "NODE_RANK", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # launch() would set the threads
    monkeypatch.setattr(rank_zero_only, "rank", getattr(rank_zero_only, "rank", 0))
    return monkeypatch


def in_slurm_task(monkeypatch, **changes) -> None:
    for key, value in {**RANK_11_OF_16, **changes}.items():
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, value)


def trainer_as_the_cli_builds_it(*overrides: str) -> L.Trainer:
    """``cfg.trainer`` of ``train.py trainer.devices=8 trainer.num_nodes=2 trainer.strategy=ddp ...`` instantiated
    with the plugins ``seqmix.cli.train`` gives it; on the CPU (8 "devices" are 8 processes; Lightning checks no
    hardware for them) and without fit."""
    cfg = compose_train([*TWO_NODES_OF_EIGHT, "trainer.accelerator=cpu", *overrides])
    return instantiate(cfg.trainer, default_root_dir=os.getcwd(), callbacks=[], logger=False,
                       enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                       plugins=[AtomicCheckpointIO(), *cluster_environment()])


def readme_multinode() -> dict:
    """The README's 2 x 8 GPU commands (section "Sweeps, multi-GPU and SLURM"): the launcher command with the
    flags its comment says it submits, and the sbatch script's #SBATCH flags and srun command."""
    section = README.read_text().split("### Sweeps, multi-GPU and SLURM", 1)[1].split("\n## ", 1)[0]
    found: dict = {}
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        lines = [line.split(" # ")[0].strip() for line in block.replace("\\\n", " ").splitlines()]
        for line in lines:
            words = shlex.split(line) if line and not line.startswith("#") else []
            if words[:4] == ["python", "train.py", "-m", "hydra/launcher=slurm"] and "trainer.strategy=ddp" in words:
                found["launcher"] = words[3:]
                found["launcher_says"] = re.findall(r"--[a-z-]+(?:=\S+)?", " ".join(
                    c for c in lines if c.startswith("#") and not c.startswith("#!")))
            if words[:3] == ["srun", "python", "train.py"]:
                found["srun"] = words[3:]
                found["sbatch"] = dict(re.match(r"#SBATCH --([a-z-]+)=?(\S*)", c).groups()
                                       for c in lines if c.startswith("#SBATCH"))
    assert set(found) == {"launcher", "launcher_says", "srun", "sbatch"}, found
    return found


# ---------------------------------------------------------------------------------------------------- launcher side


def test_two_nodes_of_eight_gpus_compose_one_task_per_gpu():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    cfg = compose_train(["hydra/launcher=slurm", *TWO_NODES_OF_EIGHT])
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("submitit_launcher.SlurmLauncher")
    # Lightning's DDP under SLURM: one task per GPU, as many nodes as trainer.num_nodes
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 8, 8)
    assert (cfg.trainer.devices, cfg.trainer.num_nodes, cfg.trainer.strategy) == (8, 2, "ddp")
    assert launcher.gpus_per_task is None and launcher.cpus_per_task == 8
    # preemption: submitit's warning (USR2, signal_delay_s ahead) and a job that may be requeued
    assert launcher.signal_delay_s > 0 and launcher.additional_parameters.requeue is True
    # only the trainer's values need setting: the launcher follows them
    other = compose_train(["hydra/launcher=slurm", "trainer.devices=4", "trainer.num_nodes=3"]).hydra.launcher
    assert (other.nodes, other.tasks_per_node, other.gpus_per_node) == (3, 4, 4)


def test_submitting_two_nodes_of_eight_writes_the_sbatch_script_lightning_needs(tmp_path, monkeypatch):
    """The launcher's own launch(), through submitit, up to ``sbatch``: a stand-in on PATH keeps the script."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    import submitit.slurm.slurm

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit looks for srun to know it is on SLURM
    (bin_dir / "sbatch").write_text('#!/bin/sh\ncp "$1" "$SBATCH_SCRIPT_COPY"\necho "Submitted batch job 4242"\n')
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SBATCH_SCRIPT_COPY", str(tmp_path / "submitted.sh"))
    monkeypatch.setattr(submitit.slurm.slurm.SlurmJob, "results", lambda job: [f"job {job.job_id}"])

    readme = readme_multinode()
    overrides = [o.replace("<partition>", "gpu") for o in readme["launcher"]]
    cfg = compose_train([*overrides, f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    check_train_config(cfg)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    assert launcher.launch([["seed=1"]], initial_job_idx=0) == ["job 4242"]

    script = (tmp_path / "submitted.sh").read_text()
    sbatch = {line for line in script.splitlines() if line.startswith("#SBATCH ")}
    for flag in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--cpus-per-task=8",
                 f"--signal=USR2@{cfg.hydra.launcher.signal_delay_s}", "--requeue", "--open-mode=append"):
        assert f"#SBATCH {flag}" in sbatch, (flag, script)
    assert not any(line.startswith(("#SBATCH --ntasks=", "#SBATCH --gpus-per-task")) for line in sbatch), script
    assert "#SBATCH --partition=gpu" in sbatch
    assert readme["launcher_says"] and {f"#SBATCH {flag}" for flag in readme["launcher_says"]} <= sbatch, script
    # every one of the 16 tasks runs the job (srun inherits the allocation's tasks): Lightning does not spawn
    srun = [line for line in script.splitlines() if line.startswith("srun ")]
    assert len(srun) == 1 and srun[0].endswith(f"-m submitit.core._submit {tmp_path / 'sweep' / '.submitit' / '%j'}")
    assert "export SUBMITIT_EXECUTOR=slurm" in script  # what seqmix's Preemption recognizes a submitit job by


@pytest.mark.parametrize("devices", ["auto", "[0,1]"])
def test_the_launcher_refuses_devices_that_are_not_a_count(devices):
    """tasks_per_node/gpus_per_node are integers: trainer.devices=auto or a list of ids is refused before anything
    is submitted."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from omegaconf.errors import ValidationError

    cfg = compose_train(["hydra/launcher=slurm", f"trainer.devices={devices}", "trainer.num_nodes=2"])
    with pytest.raises(ValidationError, match="trainer.devices"):
        instantiate(cfg.hydra.launcher)


# --------------------------------------------------------------------------------------------------------- job side


def test_rank_11_of_two_nodes_of_eight_reads_its_place_from_slurm(no_cluster):
    in_slurm_task(no_cluster)
    plugins = cluster_environment()
    assert len(plugins) == 1 and type(plugins[0]) is SLURMEnvironment
    env = plugins[0]
    assert env.auto_requeue is False  # seqmix's Preemption requeues, not Lightning's handler
    assert env.creates_processes_externally  # srun started every task: Lightning must not spawn more
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (16, 11, 3, 1)
    assert env.main_address == "gpu017"  # the first node of gpu[017-018] is rank 0's
    assert env.main_port == 15000 + 3456  # from the job id: the same on every task


def test_a_ddp_trainer_of_the_composed_config_is_rank_11_of_16(no_cluster):
    in_slurm_task(no_cluster)
    trainer = trainer_as_the_cli_builds_it()
    assert isinstance(trainer.strategy.cluster_environment, SLURMEnvironment)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    assert (trainer.world_size, trainer.global_rank, trainer.local_rank, trainer.node_rank) == (16, 11, 3, 1)
    assert (trainer.num_nodes, trainer.num_devices, trainer.is_global_zero) == (2, 8, False)
    assert rank_zero_only.rank == 11  # rank-zero-only logging is off in this task
    # what fit starts with: the job's tasks are checked against devices/num_nodes, then training runs in this
    # process (no children: srun made the 16)
    launcher = trainer.strategy.launcher
    assert launcher.launch(lambda: "trains here") == "trains here" and launcher.procs == []


@pytest.mark.parametrize("override,refusal", [
    # the job has 2 x 8 tasks but the trainer says otherwise (e.g. hydra.launcher.tasks_per_node set by hand, or a
    # hand-written script whose #SBATCH lines disagree with its srun command)
    ("trainer.devices=4", r"devices=4.*--ntasks-per-node=8.*HINT: Set `devices=8`"),
    ("trainer.num_nodes=1", r"num_nodes=1.*--nodes=2.*HINT: Set `num_nodes=2`"),
])
def test_a_job_whose_tasks_do_not_match_the_trainer_is_refused_before_training(no_cluster, override, refusal):
    in_slurm_task(no_cluster)
    trainer = trainer_as_the_cli_builds_it(override)
    with pytest.raises(ValueError, match=refusal):
        trainer.strategy.launcher.launch(lambda: pytest.fail("trained with a job that does not match"))


def test_ntasks_without_ntasks_per_node_is_refused(no_cluster):
    """``#SBATCH --ntasks=16`` leaves the spread over nodes to SLURM: Lightning's SLURM environment refuses it and
    says to use --ntasks-per-node."""
    in_slurm_task(no_cluster, SLURM_NTASKS_PER_NODE=None)
    with pytest.raises(RuntimeError, match="--ntasks-per-node"):
        cluster_environment()


def test_the_readme_sbatch_script_runs_one_ddp_rank_per_task(no_cluster):
    """The README's script: its #SBATCH flags match its srun command's trainer, and in the variables SLURM sets
    from those flags the composed command (on the CPU: accelerator=cpu, precision=32-true) passes Lightning's
    check of the job and is rank 11 of 16."""
    readme = readme_multinode()
    sbatch, overrides = readme["sbatch"], readme["srun"]
    nodes, per_node = int(sbatch["nodes"]), int(sbatch["ntasks-per-node"])
    assert "ntasks" not in sbatch and int(sbatch["gpus-per-node"]) == per_node
    assert sbatch["signal"] == "USR1@90" and "requeue" in sbatch and sbatch["open-mode"] == "append"
    cfg = compose_train(overrides)
    check_train_config(cfg)
    assert (cfg.trainer.num_nodes, cfg.trainer.devices, cfg.trainer.strategy) == (nodes, per_node, "ddp")
    assert cfg.slurm_requeue is True and cfg.resume == "auto"  # the requeued job continues the run
    in_slurm_task(no_cluster, SLURM_NNODES=str(nodes), SLURM_JOB_NUM_NODES=str(nodes),
                  SLURM_NTASKS_PER_NODE=str(per_node), SLURM_NTASKS=str(nodes * per_node),
                  SLURM_CPUS_PER_TASK=sbatch["cpus-per-task"])
    trainer = trainer_as_the_cli_builds_it(*overrides, "trainer.accelerator=cpu", "trainer.precision=32-true")
    assert (trainer.world_size, trainer.global_rank) == (16, 11)
    assert trainer.strategy.launcher.launch(lambda: "trains here") == "trains here"


def test_without_slurm_there_is_no_cluster_plugin(no_cluster):
    assert cluster_environment() == []
    trainer = trainer_as_the_cli_builds_it()  # Lightning's own environment: it starts the 8 processes itself
    assert type(trainer.strategy.cluster_environment) is LightningEnvironment
    assert not trainer.strategy.cluster_environment.creates_processes_externally and trainer.global_rank == 0
    # an interactive allocation (srun --pty bash, salloc) is not a batch job: Lightning's own test
    in_slurm_task(no_cluster, SLURM_JOB_NAME="bash")
    assert cluster_environment() == []


def test_every_rank_of_an_sbatch_job_writes_into_one_run_folder(no_cluster):
    """``srun python train.py ...`` starts 16 processes that compose the config each: the run folder comes from the
    job id (runs/slurm-<job>), not the clock, so rank 0 and rank 11 share it."""
    folders = []
    for rank, local, node in (("0", "0", "0"), ("11", "3", "1")):
        in_slurm_task(no_cluster, SLURM_PROCID=rank, SLURM_LOCALID=local, SLURM_NODEID=node)
        folders.append(Path(compose_train(TWO_NODES_OF_EIGHT).hydra.run.dir))
    assert folders[0] == folders[1] and folders[0].name == "slurm-5123456"
