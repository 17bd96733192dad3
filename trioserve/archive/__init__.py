"""Model archives: reading, checking and writing ``.mar`` files (spec §6).

- :func:`resolve_url` turns a model URL into a path inside the model store;
- :func:`unpack_archive` extracts a ``.mar`` / ``.tar.gz`` safely (or takes a directory
  as is) and reads its :class:`Manifest` and :class:`ModelConfig` (or, for an MLServer
  model folder, its ``model-settings.json`` as :class:`MlserverSettings`);
- :func:`write_archive` (and the ``trioserve-archiver`` command in :mod:`.cli`) writes
  archives the way ``torch-model-archiver`` 0.12 does.

Every refusal is an :class:`ArchiveError` carrying the HTTP status to answer with.
"""

from ._errors import ArchiveError as ArchiveError
from ._manifest import Manifest as Manifest
from ._manifest import parse_manifest as parse_manifest
from ._model_config import ModelConfig as ModelConfig
from ._model_config import parse_model_config as parse_model_config
from ._model_settings import MlserverSettings as MlserverSettings
from ._model_settings import TensorDeclaration as TensorDeclaration
from ._model_settings import parse_model_settings as parse_model_settings
from ._unpack import LoadedArchive as LoadedArchive
from ._unpack import unpack_archive as unpack_archive
from ._urls import resolve_url as resolve_url
from ._write import write_archive as write_archive

__all__ = [
    "ArchiveError",
    "LoadedArchive",
    "Manifest",
    "MlserverSettings",
    "ModelConfig",
    "TensorDeclaration",
    "parse_manifest",
    "parse_model_config",
    "parse_model_settings",
    "resolve_url",
    "unpack_archive",
    "write_archive",
]
