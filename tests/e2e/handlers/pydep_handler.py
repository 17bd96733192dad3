"""A handler that needs a package installed from the archive's requirements file
(install_py_dep_per_model): ``tinydep`` is imported when the worker loads the handler."""

import tinydep


def handle(data, context):
    if data is None:  # the call at load time
        return None
    return [f"{tinydep.ANSWER} {tinydep.__file__}" for _ in data]
