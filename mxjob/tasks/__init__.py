"""The tasks: what the model makes of each image, one module each (:mod:`mxjob.tasks.base` says what a task is).

Importing this package registers the built-in tasks, in the order ``--task``
and the docs list them; :func:`register` adds another (a ``--plugin`` file's).
"""

from mxjob.tasks import classify, custom, detect, embed
from mxjob.tasks.base import Task, TaskOption, every, get, names, of_schema, register, unregister

for _task in (classify.TASK, embed.TASK, detect.TASK, custom.TASK):
    register(_task)

__all__ = ["Task", "TaskOption", "classify", "custom", "detect", "embed", "every", "get", "names", "of_schema",
           "register", "unregister"]
