"""What the host agent (:mod:`ddlctl.host.prefork`) and the zygote it starts (:mod:`ddlctl.task.zygote`)
agree on: room kept in the zygote's blocks for a forked task's environment and command line, and its
folder. Standard library only."""

#: Environment variable of the zygote that keeps room in its environment block for a task's.
ROOM_VAR = "DDLCTL_ZYGOTE_ROOM"
ROOM_BYTES = 16384
#: The zygote's last argument: room in its command-line block for a task's.
ARGV_ROOM = " " * 4096
#: The zygote's folder (a task's is set after the fork): it holds no folder of anybody's.
ZYGOTE_CWD = "/"
