"""``hfai.client``: the names existing hfai scripts call (``hfai.client.go_suspend()`` ...)."""

from hfai._job import get_whole_life_state, go_suspend, receive_suspend_command, set_whole_life_state

__all__ = ["get_whole_life_state", "go_suspend", "receive_suspend_command", "set_whole_life_state"]
