"""train_sudoku.py --cuda_graph=True: the whole training step captured once as a CUDA graph and replayed.

On a GPU the Table 1 step is short (tens of ms) and made of hundreds of small kernels; launching them from
Python, plus clipping, AdamW and the EMA outside any compiled region, keeps the GPU waiting on the host. A
CUDA graph launches all of them at once. What a graph needs, and how the step provides it:

- static inputs: the batch is gathered on the device from the training data (which lives there) by a
  fixed index buffer the host refills before each replay (8 bytes a row, non-blocking); the learning rate
  is a tensor the host refills (AdamW fused, capturable), so warm-up needs no new graph;
- no host sync and no new allocation per replay: the draws (MLM masks, tau) come from the device's
  default generator, which a graph advances by itself; grad clipping, AdamW and the EMA (its decay a
  device tensor) are all tensor ops;
- state that persists across replays in fixed memory: the rollout buffer's tensors are copied back into
  the same storage at the end of every step (the buffer itself replaces its tensors, which a replay would
  not see).

The first WARMUP steps run eagerly on a side stream (they are training steps like any other), the next is
captured, and every later one replays it. The same training in distribution, not bit for bit: eager runs
draw from their own generator. `GraphedStep(run, capture=False)` runs the same body eagerly, which is how
the CPU tests check it (tests/test_cuda_graph.py).
"""
import torch

from sudoku.step import SudokuRun, batch_rows, learn, lr_at


WARMUP = 3  # eager steps before the capture (allocator, cuBLAS workspaces, torch.compile's first calls)
BUFFER_STATE = ("x0", "z", "maskable", "h")


class DeviceEMA:
    """sudoku.step.EMA's update with its step count and decay on the device: the same arithmetic,
    min(decay, (1 + n) / (10 + n)), without a host value that a replay would freeze."""

    def __init__(self, ema, device: str):
        self.ema = ema
        self.count = torch.tensor(float(ema.num_updates), device=device)
        self.decay = torch.tensor(float(ema.decay), device=device)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        self.count += 1
        self.ema.blend(model, 1.0 - torch.minimum(self.decay, (1 + self.count) / (10 + self.count)))

    def sync_count(self) -> None:
        """Before a save or a validation: the host's count from the device's (one host sync, not per step)."""
        self.ema.num_updates = int(self.count.item())


class GraphedStep:
    """One training step of a SudokuRun (sudoku/step.py) as a replayable body (see the module docstring)."""

    def __init__(self, run: SudokuRun, capture: bool = True):
        self.capture = capture
        cfg, device = run.cfg, run.device
        self.index = torch.zeros(cfg.batch_size, dtype=torch.long, device=device)
        self.loss = torch.zeros((), device=device)
        self.new = torch.zeros((), dtype=torch.long, device=device)
        self.ema = DeviceEMA(run.ema, device) if run.ema is not None else None
        self.static = {}
        if run.buffer is not None:  # fixed storage for the buffer's state, the tensors every replay reads
            self.static = {k: getattr(run.buffer, k) for k in BUFFER_STATE if getattr(run.buffer, k) is not None}
        self.graph, self.eager_steps = None, 0
        for group in run.optimizer.param_groups:  # a resumed eager run's float lr would be frozen into the graph
            if not isinstance(group["lr"], torch.Tensor):
                group["lr"] = torch.tensor(float(group["lr"]), device=device)

    def body(self, run: SudokuRun) -> None:
        """sudoku.step.learn on the rows in the index buffer, then its results into fixed tensors."""
        loss, new = learn(run, self.index, slice(None), self.ema)
        for name, fixed in self.static.items():  # the buffer's new state into the storage the next step reads
            fixed.copy_(getattr(run.buffer, name))
            setattr(run.buffer, name, fixed)
        self.loss.copy_(loss.detach())
        if new is not None:
            self.new.copy_(new)

    def step(self, run: SudokuRun) -> tuple[float, torch.Tensor, torch.Tensor | int]:
        """sudoku.step.train_step's contract: (lr, loss, puzzles new to the buffer) for the next global batch."""
        lr = lr_at(run.step, run.cfg)
        for group in run.optimizer.param_groups:  # tensors since __init__
            group["lr"].fill_(lr)  # outside the graph: a device write, no sync
        self.index.copy_(batch_rows(run))
        if not self.capture:
            self._eager(run)
        elif self.graph is None and self.eager_steps < WARMUP:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._eager(run)
            torch.cuda.current_stream().wait_stream(side)
        else:
            if self.graph is None:
                self.graph = torch.cuda.CUDAGraph()
                run.optimizer.zero_grad(set_to_none=True)  # the captured backward allocates the grads it rewrites
                with torch.cuda.graph(self.graph):
                    self.body(run)
            self.graph.replay()
        run.step += 1
        return lr, self.loss.clone(), self.new.clone() if run.buffer is not None else 0

    def _eager(self, run: SudokuRun) -> None:
        self.body(run)
        run.optimizer.zero_grad(set_to_none=True)
        self.eager_steps += 1

    def before_host_reads(self) -> None:
        """Validation and saving read the EMA's count on the host."""
        if self.ema is not None:
            self.ema.sync_count()
