"""What the tests share: helpers, and the small programs some tests run (a standard libp2p peer,
a DNS responder). A test module imports from here, never from another test module or from a
conftest (tests/test_rooms.py holds that), so that each test file can be read, moved or
deleted on its own."""
