"""ckpt's built-in model specs as PyTorch modules, with ckpt's ``state_dict`` names.

A state ckpt trained (``load_state_dict`` of this package, ``ckpt-tool export``)
loads into the matching module with ``load_state_dict`` (strict). This module
needs PyTorch (``pip install 'ckpt-client[torch]'``); ``import ckpt_client``
alone does not import it.
"""

try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # the package itself is stdlib-only
    raise ImportError("ckpt_client.models needs PyTorch: pip install 'ckpt-client[torch]'") from e

__all__ = ["LeNet5"]


class LeNet5(nn.Module):
    """ckpt's built-in model spec "lenet5" (worker/spec/src/model_spec.cc).

    conv 5x5 6 (padding 2), ReLU, max-pool 2; conv 5x5 16, ReLU, max-pool 2;
    flatten; linear 400->120, ReLU; linear 120->84, ReLU; linear 84->classes.
    Its parameters carry ckpt's names (``conv1.weight``, ..., ``fc3.bias``), so
    a state ckpt trained loads with ``load_state_dict(state, strict=True)``.
    TorchScript-able.

    Parameters
    ----------
    num_classes : int
        Outputs of the last layer (ckpt's "lenet5": 10).

    Examples
    --------
    >>> import torch
    >>> from ckpt_client.models import LeNet5
    >>> LeNet5()(torch.zeros(2, 1, 28, 28)).shape
    torch.Size([2, 10])
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(400, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of a batch of 1x28x28 images, normalized as ckpt trained them."""
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)
