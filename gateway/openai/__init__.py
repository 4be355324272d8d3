"""OpenAI's API on the farm: ``/v1/audio/speech`` (a TTS job streamed), ``/v1/audio/transcriptions``
(a subtitle job) and ``/v1/models``, errors in OpenAI's shape (``models.OpenAIRoute``)."""
