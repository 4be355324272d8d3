"""The gateway's WebSocket protocols: dialogue rooms (``/v1/rooms/{room}``) and live subtitles
(``/v1/live/subtitles``), admitted the same way (``socket_admission``)."""
