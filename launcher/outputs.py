"""What each stage writes in a run folder, declared once by the stage that writes it.

Every reader (the other stages, `status`, `plot`, the jobs, `training.init_from`) asks the owner here
instead of typing folder names. Data preparation's outputs live in launcher/layout.py (they are under
`data_dir`, not the run folder). Stdlib only: the samples and evaluation jobs import it inside NeMo's
container.

    >>> TrainingOutputs(Path("/r")).checkpoints
    PosixPath('/r/training/results/checkpoints')
    >>> SamplesOutputs(Path("/r")).grid(4)
    PosixPath('/r/samples/step_4/grid.png')
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from launcher import checkpoints
from launcher.paths import RunPaths


@dataclass(frozen=True)
class TrainingOutputs:
    """NeMo's sd_train.py writes under exp_manager.explicit_log_dir = `results`: `checkpoints/` (names,
    EMA twins and `-unfinished` markers: launcher.checkpoints), `hparams.yaml`, the TensorBoard
    events. The launcher writes the NeMo config `<training.run.name>.yaml` beside `results`, and at a real
    launch `training.json`, the training the folder holds."""

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("training")

    def config(self, name: str) -> Path:
        return self.stage_dir / f"{name}.yaml"

    def configs(self) -> list[Path]:
        """Every training config written into the run (one per training name)."""
        return sorted(self.stage_dir.glob("*.yaml"))

    @property
    def results(self) -> Path:
        return self.stage_dir / "results"

    @property
    def checkpoints(self) -> Path:
        return self.results / "checkpoints"

    @property
    def hparams(self) -> Path:
        return self.results / "hparams.yaml"

    @property
    def record(self) -> Path:
        """The training this run folder holds, written when it was launched (launcher.stages.training_record)."""
        return self.stage_dir / "training.json"

    @property
    def attempts(self) -> Path:
        """Every attempt of the training's parts, one row per event (launcher.stages.training_attempts)."""
        return self.stage_dir / "attempts.tsv"

    @property
    def init_unet(self) -> Path:
        """The UNet-only state dict that `training.init_from` starts from (written by its init job)."""
        return self.stage_dir / "init" / "unet.ckpt"

    @staticmethod
    def source_of(unet: Path) -> Path:
        """Written by the init job beside the UNet it extracted: the checkpoint it came from."""
        return unet.with_name(unet.name + ".source")

    @property
    def init_source(self) -> Path:
        return self.source_of(self.init_unet)

    def earlier_run(self) -> Path | None:
        """The run whose checkpoint training.init_from started this one from, when it was a run's own."""
        if not self.init_source.is_file():
            return None
        checkpoint = Path(self.init_source.read_text().strip())
        run = checkpoint.parents[3] if len(checkpoint.parents) > 3 else None
        return run if run is not None and TrainingOutputs(run).checkpoints == checkpoint.parent else None

    def newest_checkpoint(self, ema: bool) -> Path | None:
        """The newest finished checkpoint (its `-EMA` kind when `ema`)."""
        return checkpoints.newest(self.checkpoints, ema)

    def newest_weights(self) -> Path | None:
        """The newest finished checkpoint's best weights: its EMA twin when the run kept EMA weights."""
        plain = checkpoints.newest(self.checkpoints, ema=False)
        if plain is None:
            return checkpoints.newest(self.checkpoints, ema=True)
        twin = checkpoints.ema_twin(plain)
        return twin if twin.is_file() else plain


@dataclass(frozen=True)
class SamplesOutputs:
    """The samples job: `samples.json` (its settings), then per sampled checkpoint `step_<N>/` with the
    `model.nemo` it made sampleable (converted, or a .nemo trained from cached text embeddings with its text
    encoders back), `model.nemo.source` (the checkpoint it came from), `grid.png`, `samples.json`."""

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("samples")

    @property
    def settings(self) -> Path:
        return self.stage_dir / "samples.json"

    def step_dir(self, step: int | str | None) -> Path:
        return self.stage_dir / f"step_{step}"

    def model(self, step: int | str | None) -> Path:
        return self.step_dir(step) / "model.nemo"

    def model_source(self, step: int | str | None) -> Path:
        return self.step_dir(step) / "model.nemo.source"

    def grid(self, step: int | str | None) -> Path:
        return self.step_dir(step) / "grid.png"

    def grids(self) -> list[Path]:
        """Every grid written, lowest step first."""
        found = self.stage_dir.glob("step_*/grid.png")
        return sorted(found, key=lambda p: int(p.parent.name.removeprefix("step_")))

    def newest_converted(self) -> tuple[Path, Path] | None:
        """(model.nemo, the checkpoint it was made from) of the highest step, if any."""
        found = []
        for source in self.stage_dir.glob("step_*/model.nemo.source"):
            step = source.parent.name.removeprefix("step_")
            if step.isdigit() and self.model(int(step)).is_file():
                found.append((int(step), self.model(int(step)), Path(source.read_text())))
        if not found:
            return None
        _, nemo, checkpoint = max(found)
        return nemo, checkpoint


@dataclass(frozen=True)
class EvaluationOutputs:
    """The evaluation's jobs: `evaluation.json` (settings), `captions.json` and `captions/`, images per
    guidance scale, NeMo configs, then `results.csv`, `results.md` and the plot `fid_clip.png`."""

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("evaluation")

    @property
    def settings(self) -> Path:
        return self.stage_dir / "evaluation.json"

    @property
    def captions_json(self) -> Path:
        return self.stage_dir / "captions.json"

    @property
    def captions_dir(self) -> Path:
        return self.stage_dir / "captions"

    @property
    def images(self) -> Path:
        return self.stage_dir / "images"

    def images_for(self, scale: float) -> Path:
        """generate_fid_images.py's folder for one scale: fid.save_path / str(scale)."""
        return self.images / str(float(scale))

    def image(self, scale: float, n: int) -> Path:
        """The image of caption `n` at `scale`, as generate_fid_images.py names it (score.py pairs it
        with the caption by that number)."""
        return self.images_for(scale) / f"image{n:06d}.png"

    @property
    def configs(self) -> Path:
        return self.stage_dir / "configs"

    @property
    def results_csv(self) -> Path:
        return self.stage_dir / "results.csv"

    @property
    def results_md(self) -> Path:
        return self.stage_dir / "results.md"

    @property
    def plot(self) -> Path:
        return self.stage_dir / "fid_clip.png"


@dataclass(frozen=True)
class BenchmarkOutputs:
    """The throughput sweep (launcher.bench): `cases.json`, each case's NeMo config and its tasks' files
    (launcher.bench.cases), then the report job's `report.md`, `report.csv`, `report.json`, `throughput.png`."""

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("benchmark")

    @property
    def report_md(self) -> Path:
        return self.stage_dir / "report.md"

    @property
    def report_csv(self) -> Path:
        return self.stage_dir / "report.csv"

    @property
    def report_json(self) -> Path:
        """What each task measured (the rows `compare` and training's cost estimate read)."""
        return self.stage_dir / "report.json"

    @property
    def plot(self) -> Path:
        return self.stage_dir / "throughput.png"


@dataclass(frozen=True)
class DataCheckOutputs:
    run_dir: Path

    @property
    def report(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("data_check") / "report.json"


@dataclass(frozen=True)
class RehearsalOutputs:
    """The rehearsal job (launcher.jobs.rehearsal): in `work/` the tiny training config and NeMo's results
    (checkpoints, hparams, TensorBoard) and each step's record; `sample.png`; `report.json`, which
    `status` and the launch summary read."""

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("rehearsal")

    @property
    def workdir(self) -> Path:
        return self.stage_dir / "work"

    @property
    def sample(self) -> Path:
        return self.stage_dir / "sample.png"

    @property
    def report(self) -> Path:
        return self.stage_dir / "report.json"


@dataclass(frozen=True)
class ExportFolder:
    """One exported checkpoint's files (launcher/jobs/export.py): `diffusers/`, the pipeline folder
    DiffusionPipeline.from_pretrained loads; `<run>-step_<N>.safetensors`, the single file in the original
    layout (ComfyUI, A1111); `lora/pytorch_lora_weights.safetensors` for a LoRA run; `export.json`, what
    was exported and what the job's checks measured (written last)."""

    path: Path
    single_file_name: str

    @property
    def pipeline(self) -> Path:
        return self.path / "diffusers"

    @property
    def single_file(self) -> Path:
        return self.path / self.single_file_name

    @property
    def lora(self) -> Path:
        return self.path / "lora" / "pytorch_lora_weights.safetensors"

    @property
    def record(self) -> Path:
        return self.path / "export.json"


@dataclass(frozen=True)
class ExportOutputs:
    """The export job: `export.json` (its settings), then per exported checkpoint `step_<N>/` (ExportFolder),
    written as `.step_<N>.partial/` and renamed once the job's checks passed: nothing half-written looks
    complete.

    >>> ExportOutputs(Path("/r/run")).folder(4).single_file
    PosixPath('/r/run/export/step_4/run-step_4.safetensors')
    """

    run_dir: Path

    @property
    def stage_dir(self) -> Path:
        return RunPaths(self.run_dir).stage_dir("export")

    @property
    def settings(self) -> Path:
        return self.stage_dir / "export.json"

    def _name(self, step: int | str) -> str:
        return f"{self.run_dir.name}-step_{step}.safetensors"

    def folder(self, step: int | str) -> ExportFolder:
        return ExportFolder(self.stage_dir / f"step_{step}", self._name(step))

    def partial(self, step: int | str) -> ExportFolder:
        return ExportFolder(self.stage_dir / f".step_{step}.partial", self._name(step))

    def exported(self) -> list[ExportFolder]:
        """Every finished export (its record written), lowest step first."""
        steps = [
            int(record.parent.name.removeprefix("step_"))
            for record in self.stage_dir.glob("step_*/export.json")
            if record.parent.name.removeprefix("step_").isdigit()
        ]
        return [self.folder(step) for step in sorted(steps)]


def plots_dir(run_dir: Path) -> Path:
    """Where `python -m launcher plot` writes (no stage owns it: the command reads every stage's logs)."""
    return run_dir / "plots"
