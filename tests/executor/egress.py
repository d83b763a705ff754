# A CONNECT through the executor's egress proxy to the target the test wrote in the tree.
import os, socket
host, port = os.environ['HTTPS_PROXY'].removeprefix('http://').split(':')
target = open('target.txt').read().strip()
s = socket.create_connection((host, int(port)), timeout=10)
s.sendall(f'CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n'.encode())
print(s.recv(4096).split(b'\r\n')[0].decode())
