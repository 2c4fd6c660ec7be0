"""stepwatch._config: identity from arguments and launcher environments."""

import unittest

from stepwatch import _config


class ResolveTest(unittest.TestCase):
    def test_plain_torch_launch(self):
        env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "10.0.0.1",
               "MASTER_PORT": "29500"}
        ident = _config.resolve(env=env)
        self.assertEqual((ident.rank, ident.world_size, ident.local_rank), (3, 8, 1))
        self.assertEqual(ident.job, "torch-10.0.0.1-29500")
        self.assertEqual(ident.socket_path, _config.DEFAULT_SOCKET)

    def test_torchelastic_run_id_and_override(self):
        env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "run42"}
        self.assertEqual(_config.resolve(env=env).job, "run42")
        env["STEPWATCH_JOB"] = "mine"
        self.assertEqual(_config.resolve(env=env).job, "mine")

    def test_torchelastic_none_is_not_a_job_id(self):
        env = {"RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none",
               "SLURM_JOB_ID": "77"}
        self.assertEqual(_config.resolve(env=env).job, "slurm-77")

    def test_slurm(self):
        env = {"SLURM_JOB_ID": "991", "SLURM_PROCID": "5", "SLURM_NTASKS": "16",
               "SLURM_LOCALID": "1"}
        ident = _config.resolve(env=env)
        self.assertEqual((ident.job, ident.rank, ident.world_size, ident.local_rank),
                         ("slurm-991", 5, 16, 1))

    def test_torch_variables_win_over_slurm(self):
        env = {"SLURM_JOB_ID": "991", "SLURM_PROCID": "5", "SLURM_NTASKS": "16",
               "RANK": "2", "WORLD_SIZE": "4"}
        ident = _config.resolve(env=env)
        self.assertEqual((ident.rank, ident.world_size), (2, 4))

    def test_explicit_arguments_win(self):
        env = {"RANK": "1", "WORLD_SIZE": "2", "STEPWATCH_JOB": "envjob",
               "STEPWATCH_SOCKET": "/tmp/env.sock"}
        ident = _config.resolve(job="j", rank=0, world_size=4, socket_path="/tmp/x.sock",
                                gpu=3, dp_rank=0, pp_stage=1, tp_rank=0, env=env)
        self.assertEqual((ident.job, ident.rank, ident.world_size), ("j", 0, 4))
        self.assertEqual((ident.gpu, ident.dp_rank, ident.pp_stage, ident.tp_rank), (3, 0, 1, 0))
        self.assertEqual(ident.socket_path, "/tmp/x.sock")

    def test_socket_from_environment(self):
        ident = _config.resolve(env={"STEPWATCH_SOCKET": "/tmp/a.sock"})
        self.assertEqual(ident.socket_path, "/tmp/a.sock")

    def test_single_process_without_job_gets_one(self):
        ident = _config.resolve(env={})
        self.assertEqual((ident.rank, ident.world_size), (0, 1))
        self.assertTrue(ident.job.startswith("local-"), ident.job)

    def test_invalid_values_raise_clear_errors(self):
        with self.assertRaisesRegex(ValueError, "RANK"):
            _config.resolve(env={"RANK": "abc", "WORLD_SIZE": "2", "STEPWATCH_JOB": "j"})
        with self.assertRaisesRegex(ValueError, "not below"):
            _config.resolve(job="j", rank=2, world_size=2, env={})
        with self.assertRaisesRegex(ValueError, "world_size"):
            _config.resolve(job="j", rank=0, world_size=0, env={})
        with self.assertRaisesRegex(ValueError, "job id"):
            _config.resolve(env={"RANK": "0", "WORLD_SIZE": "2"})
        with self.assertRaisesRegex(ValueError, "job"):
            _config.resolve(job="", env={})
        with self.assertRaisesRegex(ValueError, "gpu"):
            _config.resolve(gpu=-1, env={})
        with self.assertRaisesRegex(ValueError, "unknown"):
            _config.resolve(color=1, env={})


if __name__ == "__main__":
    unittest.main()
