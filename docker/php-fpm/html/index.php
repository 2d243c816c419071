<?php
// A stand-in for your application: what PHP is told about the request.
header('Content-Type: text/plain; charset=utf-8');
foreach (['REMOTE_ADDR', 'REQUEST_METHOD', 'REQUEST_URI', 'SCRIPT_NAME', 'PATH_INFO', 'HTTP_HOST'] as $k) {
    printf("%-15s %s\n", $k, $_SERVER[$k] ?? '');
}
