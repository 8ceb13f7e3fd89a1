"""Node backends: ``base`` (the protocol and the values it passes), ``local`` (processes on
this machine). The controller talks to nodes only through :class:`base.Backend`."""
