"""Client of ckpt's scheduler service (``ckpt-scheduler serve``).

Speaks the control socket's JSON-lines protocol (documented in
``scheduler/include/ckpt/scheduler/control_client.h``) with the standard
library only::

    from ckpt_client import Client, load_state_dict
    c = Client("/run/ckpt/control.sock")
    name = c.submit("examples/demo.toml")
    for progress in c.watch(name):
        print(progress["line"])
    best = c.results(name)          # a DataFrame when pandas is importable
    state = load_state_dict(f"{name}/m003", client=c)

``ckpt_client.models``, ckpt's built-in models as PyTorch modules
(``LeNet5``), needs torch and is imported on its own::

    from ckpt_client.models import LeNet5
    LeNet5().load_state_dict(state)
"""

from .client import CkptError, Client, DEFAULT_SOCKET, load_state_dict, results

__all__ = ["CkptError", "Client", "DEFAULT_SOCKET", "load_state_dict", "results"]
