// Preloaded into reqlite by .ci/rethink.sh (node -r). Two fixes to how
// reqlite uses sockets, without touching its code:
//  - reqlite calls server.listen(port, callback), which binds every
//    interface; a listen on a bare port here binds 127.0.0.1 only.
//  - reqlite writes one response in several small writes on sockets with
//    Nagle's algorithm on, which meets the client's delayed ACK: many
//    queries then take 40 ms instead of 1 ms. Accepted sockets get
//    TCP_NODELAY.
'use strict';
const net = require('net');

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  if (typeof args[0] === 'number' || (typeof args[0] === 'string' && /^\d+$/.test(args[0]))) {
    if (typeof args[1] !== 'string') {
      args.splice(1, 0, '127.0.0.1');
    }
  } else if (args[0] !== null && typeof args[0] === 'object' && !args[0].path) {
    args[0] = Object.assign({}, args[0], { host: '127.0.0.1' });
  }
  this.on('connection', (socket) => socket.setNoDelay(true));
  return listen.apply(this, args);
};
