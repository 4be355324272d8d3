"""What every route of the gateway shares: the submit and its refusals in HTTP's terms, the one
multipart upload receiver, and the WebSockets' close codes and error frames. Nothing here imports
a route module."""
