<?php
// What a legacy PHP app sees behind tollgate: the fields of $_SERVER that
// carry the client's address and scheme, as JSON. Used by docker-compose.yml
// and by tests/php.rs (which sets TOLLGATE_TEST_HITS to count the requests
// that reach PHP).
$hits = getenv('TOLLGATE_TEST_HITS');
if ($hits) {
    file_put_contents($hits, $_SERVER['REQUEST_URI'] . "\n", FILE_APPEND | LOCK_EX);
}
$fields = [
    'REMOTE_ADDR', 'HTTP_X_REAL_IP', 'HTTP_X_FORWARDED_FOR',
    'HTTP_X_FORWARDED_PROTO', 'HTTP_HOST', 'HTTPS', 'REQUEST_URI',
];
$out = [];
foreach ($fields as $f) {
    $out[$f] = $_SERVER[$f] ?? null;
}
header('Content-Type: application/json');
echo json_encode($out, JSON_UNESCAPED_SLASHES), "\n";
