"""Kubeflow Pipelines components (thin shells over dlrover_core.api).

The image every component runs on is set in one place: ``DLROVER_RM_IMAGE`` in the
environment when the components are imported (i.e. when a pipeline is compiled), else
:data:`DEFAULT_IMAGE`, the tag the repo's ``Dockerfile`` documents.
"""

import os

IMAGE_ENV = "DLROVER_RM_IMAGE"
DEFAULT_IMAGE = "dlrover-rm:0.1.0"


def base_image() -> str:
    """The components' image: ``$DLROVER_RM_IMAGE`` or :data:`DEFAULT_IMAGE`."""
    value = os.environ.get(IMAGE_ENV)
    if value is None:
        return DEFAULT_IMAGE
    image = value.strip()
    if not image or any(c.isspace() for c in image):
        raise ValueError(
            f"{IMAGE_ENV}={value!r} is not an image reference; give one such as "
            f"registry.example/dlrover-rm:0.1.0, or unset it for {DEFAULT_IMAGE}"
        )
    return image


BASE_IMAGE = base_image()
