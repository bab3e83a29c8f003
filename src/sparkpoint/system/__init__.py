"""Systems: where streams live. See :mod:`sparkpoint.system.base` for the interfaces."""
