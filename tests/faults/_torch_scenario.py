"""A torch rank program whose collective fails inside unison: `python _torch_scenario.py PIDDIR`.

The ranks allreduce tensors of different shapes under one name, so unison raises MismatchError from
its own code (through torch's autograd) on every rank; the failure summary must point at this file.
"""

import os
import sys
from pathlib import Path

import torch

import unison.torch as hvd

hvd.init()
(Path(sys.argv[1]) / f"pid-{hvd.rank()}").write_text(str(os.getpid()))
gradient = torch.ones(hvd.rank() + 1)
hvd.allreduce(gradient, name="grad")  # the line the summary must show
