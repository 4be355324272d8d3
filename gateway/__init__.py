"""The HTTP gateway: one more producer of the farm's jobs, for clients in any language and browsers.

``farm gateway`` serves it (``farm up`` starts one on loopback). Its routes come from the family
registry: every family gets ``POST /v1/jobs/<family>`` with its own request model as the body, and
every job can be followed (``GET /v1/jobs/<id>``, Server-Sent Events at ``/events``), fetched
(``/artifacts/<name>``) and cancelled (``DELETE``). Media may be uploaded first (``POST
/v1/uploads``) and named as ``upload:<id>`` by a job. A dialogue room (``WebSocket
/v1/rooms/<room>``, :mod:`mediafarm.gateway.ws.rooms`) takes lines and streams their speech back in
line order. docs/gateway.md is the manual.

In parts: ``http`` (the farm's own job and upload routes), ``openai`` (OpenAI's speech,
transcription and model routes), ``ws`` (the WebSocket protocols), and ``common``, what they share
(the one submit and its refusals, the upload receiver, the read model of a job, the sockets' close
codes); a part imports no other, and ``app`` wires them.

The gateway submits and follows jobs with the producer API (``tasks.producer.client``, ``tasks.producer.handles``)
and never imports the worker side. Nothing here is imported by ``import mediafarm``: the FastAPI
app needs the ``gateway`` extra. The uploads' layout on disk, which ``farm gc`` reads too, is
:mod:`mediafarm.tasks.wire.upload_store`, beside the artifact store, so the worker side never imports
the gateway.
"""
