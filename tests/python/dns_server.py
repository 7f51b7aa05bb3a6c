"""A DNS server for the e2e tests: PyPI's dnslib, UDP and TCP on 127.0.0.1:PORT, answering TXT
queries from a JSON zone file ({"name.": ["value", ...]}) read again at every query, so a test
changes the zone by rewriting the file. A name not in the file is NXDOMAIN; other types of a
name in it get an empty answer.

    python dns_server.py PORT ZONE_JSON
"""

import json
import sys
import time

from dnslib import QTYPE, RCODE, RR, TXT
from dnslib.server import BaseResolver, DNSServer


class ZoneFile(BaseResolver):
    def __init__(self, path):
        self.path = path

    def resolve(self, request, handler):
        reply = request.reply()
        name = str(request.q.qname).lower()
        try:
            with open(self.path, encoding="utf-8") as f:
                zone = json.load(f)
        except (OSError, ValueError):
            zone = {}
        values = zone.get(name)
        if values is None:
            reply.header.rcode = RCODE.NXDOMAIN
        elif request.q.qtype == QTYPE.TXT:
            for value in values:
                reply.add_answer(RR(request.q.qname, QTYPE.TXT, rdata=TXT(value), ttl=0))
        return reply


def main():
    port, path = int(sys.argv[1]), sys.argv[2]
    resolver = ZoneFile(path)
    servers = [
        DNSServer(resolver, port=port, address="127.0.0.1", tcp=tcp) for tcp in (False, True)
    ]
    for server in servers:
        server.start_thread()
    while all(server.isAlive() for server in servers):
        time.sleep(0.2)


if __name__ == "__main__":
    main()
