"""Stage 6: candidates and costs -> a Plan (a binary program on HiGHS), its memory."""
